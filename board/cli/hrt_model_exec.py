"""hrt_model_exec: model_info, infer and perf, in-process or against a board.

    hrt_model_exec model_info --model_file m.bin
    hrt_model_exec infer --model_file m.bin --input_file img.jpg [--board HOST:PORT]
    hrt_model_exec perf  --model_file m.bin --thread_num 2 --frame_count 200 --profile_path .
    hrt_model_exec infer --model_file m.bin --ssh root@board[:22] --identity ~/.ssh/id_ed25519
    hrt_model_exec perf  --model_file m.bin --board a:9473,b:9473 (or @boards.txt) --tls-ca ca.pem

Flags are the real tool's, spelled the same way, and gflags' spellings work
too: ``--model_file=a.bin,b.bin``, ``-model_file=a.bin``, a bare
``--enable_dump`` or ``--enable_dump=True`` (bpuemu.board.cli.options).
Without --board or --ssh the runtime runs in this process: on a board that is
the board itself, on a host it is the x86 simulator. --ssh needs the host
install (the SSH transport is a plugin, see bpuemu.board.backends).
With several boards, perf fans out to all of them (and infer/model_info run on
each): see bpuemu.board.cli.hrt_model_exec_farm.
"""
import os
import sys

import click

from bpuemu.common.atomic import write_file_atomic
from bpuemu.common.version import RUNTIME_VERSION, __version__
from bpuemu.board.cli.edge import run
from bpuemu.board.cli.options import (BOOL, CONNECTION_HINTS, GflagsCommand, connection_options, first_board, model_options, split_list,
                                      version_option)

#: Hints in this command's own flags for library errors about a subject (see bpuemu.board.cli.edge).
HINTS = {**CONNECTION_HINTS, "model_name": "pass --model_name NAME", "model_file": "pass --model_file FILE.bin",
         "input_file": "pass one file per input: --input_file a.bin,b.bin",
         "ssh_login": "check the user (USER@ in --ssh), the password (-p) or the key (--identity)"}


def _farm(board):
    """The boards of --board when it names several (a farm), else None."""
    if not board or ("," not in board and not board.lstrip().startswith("@")):
        return None
    from bpuemu.board.farm import parse_boards

    boards = parse_boards(board)  # --ssh with --board is refused by the ssh option group already
    return boards if len(boards) > 1 else None


def _access(token, tls):
    from bpuemu.board.farm import BoardAccess

    return BoardAccess(token=token, tls=tls, client_name="hrt_model_exec")


def json_option(f):
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one machine-readable JSON document instead of the console text "
                             "(bpuemu.common.exec_json; README: hrt_model_exec --json).")(f)


def _one_board_for_json(boards, as_json):
    if boards and as_json:
        raise click.UsageError("--json takes one board; several boards print the farm's console text")


def _json(command, be, **fields) -> None:
    from bpuemu.common import exec_json

    platform = be.platform
    click.echo(exec_json.document(command, platform.arch, platform.onnxruntime_version, be.load_ms, **fields))


def input_option(f):
    return click.option("--input_file", default="",
                        help="One file per input, comma separated: .bin, .npy, .txt, .jpg/.jpeg/.png.")(f)


def _open(model_file, board, token, ssh=None, tls=None):
    from bpuemu.board.backends import open_backend

    return open_backend(split_list(model_file), board=first_board(board), token=token, ssh=ssh, tls=tls)


def _random_inputs(handle):
    from bpuemu.common.input_types import random_rt_inputs

    return random_rt_inputs(handle.model.input_specs)


def _inputs(handle, input_file):
    from bpuemu.board.runtime.inputs import read_inputs

    files = split_list(input_file)
    return read_inputs(files, handle.model.input_specs) if files else []


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("hrt_model_exec", "-v", "--version", version=f"{__version__} ({RUNTIME_VERSION})")
def cli():
    """Run, inspect and measure BPU models (emulated by bpuemu)."""


@cli.command("model_info", cls=GflagsCommand)
@model_options
@connection_options
@json_option
def model_info(model_file, model_name, core_id, board, token, ssh, tls, as_json):
    """Print input and output tensor properties."""
    from bpuemu.board.cli.hrt_model_exec_text import model_info_text

    boards = _farm(board)
    _one_board_for_json(boards, as_json)
    if boards:
        from bpuemu.board.cli import hrt_model_exec_farm as farm_cmd

        return farm_cmd.model_info(boards, split_list(model_file), model_name, _access(token, tls))
    with _open(model_file, board, token, ssh, tls) as be:
        handles = [be.model(model_name)] if model_name else [be.models[n] for n in be.model_names]
        if as_json:
            return _json("model_info", be, models=[{"name": h.name, "inputs": h.input_names, "outputs": h.output_names}
                                                   for h in handles])
        click.echo(model_info_text([h.model for h in handles], be.description, be.load_ms))


@cli.command("infer", cls=GflagsCommand)
@model_options
@connection_options
@input_option
@click.option("--frame_count", default=1, show_default=True, type=click.IntRange(1), help="Frames to run.")
@click.option("--enable_dump", default=False, type=BOOL, help="Write the outputs to files.")
@click.option("--dump_format", default="bin", show_default=True, type=click.Choice(["bin", "txt"]))
@click.option("--dump_precision", default=9, show_default=True, type=click.IntRange(0, 20), help="Decimals in txt dumps.")
@click.option("--dump_txt_axis", default=-1, show_default=True, type=int, help="txt dumps: one line per index up to this axis (-1: last).")
@click.option("--dump_intermediate", default=0, show_default=True, type=click.IntRange(0, 3),
              help="Dump every step's inputs and outputs: 1 bin, 2/3 bin and txt.")
@click.option("--dump_path", default=".", show_default=True, type=click.Path(file_okay=False), help="Where dumps go.")
@json_option
def infer(model_file, model_name, core_id, board, token, ssh, tls, input_file, frame_count, enable_dump, dump_format,
          dump_precision, dump_txt_axis, dump_intermediate, dump_path, as_json):
    """Run inference on the given inputs (random ones when none are given)."""
    from bpuemu.board.runtime import dump
    from bpuemu.board.cli.hrt_model_exec_text import infer_text

    def _dump(where, h, result):
        """(output -> files, tensor -> files) of the dumps asked for."""
        outputs = dump.dump_outputs(where, h.name, result.outputs, dump_format, dump_precision, dump_txt_axis) \
            if enable_dump else {}
        inter = dump.dump_intermediate(where, h.model, result.intermediates, dump_intermediate, dump_precision,
                                       dump_txt_axis) if dump_intermediate else {}
        return outputs, inter

    boards = _farm(board)
    _one_board_for_json(boards, as_json)
    if boards:
        from bpuemu.board.farm import profile_dir
        from bpuemu.board.cli import hrt_model_exec_farm as farm_cmd

        def dumps(target, h, result):  # each board's files in a directory of its own
            where = profile_dir(dump_path, target)
            return dump.files_of(*_dump(where, h, result))

        return farm_cmd.infer(boards, split_list(model_file), model_name, _access(token, tls),
                              lambda h: _inputs(h, input_file) or _random_inputs(h), frame_count, dump_intermediate > 0,
                              dumps)
    with _open(model_file, board, token, ssh, tls) as be:
        h = be.model(model_name)
        inputs = _inputs(h, input_file)
        if not inputs:
            click.echo("no --input_file given: using random inputs", err=True)
            inputs = _random_inputs(h)
        result = h.infer(inputs, frame_count=frame_count, dump_intermediate=dump_intermediate > 0)
        outputs, intermediates = _dump(dump_path, h, result)
        if as_json:
            from bpuemu.common.exec_json import tensor

            def rel(files):
                return [os.path.relpath(f, dump_path) for f in files]

            return _json("infer", be, model=h.name, latency_ms=result.latency_ms,
                         outputs=[tensor(n, a, rel(outputs.get(n, []))) for n, a in result.outputs.items()],
                         intermediates=[tensor(n, result.intermediates[n], rel(f)) for n, f in intermediates.items()])
        click.echo(infer_text(h.name, result.outputs, result.latency_ms))
        written = dump.files_of(outputs, intermediates)
        if written:
            click.echo(f"dumped {len(written)} file(s) to {os.path.abspath(dump_path)}")


@cli.command("perf", cls=GflagsCommand)
@model_options
@connection_options
@input_option
@click.option("--frame_count", default=200, show_default=True, type=click.IntRange(1), help="Frames to run when perf_time is 0.")
@click.option("--perf_time", default=0.0, show_default=True, type=click.FloatRange(0), help="Run this many minutes (0: use frame_count).")
@click.option("--thread_num", default=1, show_default=True, type=click.IntRange(1, 8), help="Threads running frames.")
@click.option("--profile_path", default="", help="Directory for profiler.log and profiler.csv (off when empty).")
@json_option
def perf(model_file, model_name, core_id, board, token, ssh, tls, input_file, frame_count, perf_time, thread_num,
         profile_path, as_json):
    """Measure latency and frame rate on the board itself (on every board of a farm at once)."""
    from bpuemu.board.runtime.perf_job import PerfConfig

    config = PerfConfig(frame_count=frame_count, perf_time_minutes=perf_time, thread_num=thread_num,
                        core_id=core_id, profile=bool(profile_path))
    boards = _farm(board)
    _one_board_for_json(boards, as_json)
    if boards:
        from bpuemu.board.cli import hrt_model_exec_farm as farm_cmd

        return farm_cmd.perf(boards, split_list(model_file), model_name, _access(token, tls), config,
                             lambda h: _inputs(h, input_file), _progress, profile_path)
    with _open(model_file, board, token, ssh, tls) as be:
        h = be.model(model_name)
        inputs = _inputs(h, input_file)
        with _progress(frame_count if perf_time == 0 else 0) as progress:
            report = h.perf(config, inputs, progress=progress)
        profiler_files = []
        if profile_path:
            os.makedirs(profile_path, exist_ok=True)
            for name, text in (("profiler.log", report.profiler_log), ("profiler.csv", report.profiler_csv)):
                write_file_atomic(os.path.join(profile_path, name), text)
                profiler_files.append(name)
        if as_json:
            return _json("perf", be, model=h.name, result=report.summary(), profiler_files=profiler_files)
    click.echo(report.console())
    if profile_path:
        click.echo(f"profiler data written to {os.path.join(os.path.abspath(profile_path), 'profiler.log')} and profiler.csv")


class _progress:
    """A tqdm bar on stderr while perf runs (only when stderr is a terminal)."""

    def __init__(self, total: int):
        self.total = total
        self.bar = None

    def __enter__(self):
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=self.total or None, unit="frame", desc="perf", leave=False, file=sys.stderr)
        return self

    def __call__(self, done, total, elapsed):
        if self.bar is not None:
            self.bar.update(done - self.bar.n)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


def main(args=None):
    run(cli, "hrt_model_exec", args, hints=HINTS)


if __name__ == "__main__":
    main()
