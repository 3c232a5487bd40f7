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
With several boards (a farm, bpuemu.board.farm) every command runs on each of
them through the same backend call: perf prints each board's block, then a
table of all boards and their aggregate; infer and model_info print each
board's result, infer also whether the boards agree bit for bit. A board that
fails is left out of the results (a FAILED row in perf's table) and named in
the one ERROR line; the others' results are printed all the same, exit status 1.
"""
import os
import sys
import threading

import click

from bpuemu.common.version import RUNTIME_VERSION, __version__
from bpuemu.board.cli.edge import run
from bpuemu.board.cli.options import (BOOL, CONNECTION_HINTS, GflagsCommand, connection_options, model_options, split_list,
                                      version_option)

#: Hints in this command's own flags for library errors about a subject (see bpuemu.board.cli.edge).
HINTS = {**CONNECTION_HINTS, "model_name": "pass --model_name NAME", "model_file": "pass --model_file FILE.bin",
         "input_file": "pass one file per input: --input_file a.bin,b.bin",
         "ssh_login": "check the user (USER@ in --ssh), the password (-p) or the key (--identity)"}


def _command(name):
    """A subcommand taking the model flags (--model_file, --model_name, --core_id) and the board(s) to run on."""
    def decorate(f):
        return cli.command(name, cls=GflagsCommand)(model_options(connection_options(f)))
    return decorate


def json_option(f):
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one machine-readable JSON document instead of the console text "
                             "(bpuemu.common.exec_json; docs/formats.md: --json).")(f)


def _json(command, be, **fields) -> None:
    from bpuemu.common import exec_json

    platform = be.platform
    click.echo(exec_json.document(command, platform.arch, platform.onnxruntime_version, be.load_ms, **fields))


def timing_option(f):
    return click.option("--timing", default="host", show_default=True, type=click.Choice(["host", "x5"]),
                        help="x5: every frame lasts at least its modeled RDK X5 time (a J6 .hbm's: the X5 model scaled per its "
                             "march, assumed; threads share one modeled BPU), "
                             "so an application sees the board's latency and throughput; host: as fast as this "
                             "machine runs. In-process only: a board paces itself (hrt_boardd --timing x5).")(f)


def _set_timing(timing, board, ssh):
    if timing == "host":
        return
    if board or ssh:
        raise click.UsageError("--timing x5 paces in-process runs; start the board with: hrt_boardd --timing x5")
    from bpuemu.board.runtime.model import set_timing

    set_timing(timing)


def march_option(f):
    return click.option("--march", default=None, metavar="MARCH",
                        help="The in-process board's march (default: $BPUEMU_BOARD_MARCH, else bayes-e; nash-e/m/b/h/p "
                             "run J6 .hbm models): a model compiled for another is refused. A remote board has its "
                             "own (hrt_boardd --march; over SSH, the board's BPUEMU_BOARD_MARCH).")(f)


def _set_march(march, board, ssh):
    """The in-process board's march: --march, else the board's environment (BPUEMU_BOARD_MARCH: how a board
    reached over SSH, running this command, says what it is); a remote board's own is never set from here."""
    from bpuemu.board.runtime import BOARD_MARCH_ENV, set_board_march

    if board or ssh:
        if march is not None:
            raise click.UsageError("--march sets the in-process board's march; a remote board has its own: "
                                   f"start it with hrt_boardd --march (over SSH: {BOARD_MARCH_ENV} on the board)")
        return
    march = march or os.environ.get(BOARD_MARCH_ENV, "").strip()
    if march:
        set_board_march(march)


def input_option(f):
    return click.option("--input_file", default="",
                        help="One file per input, comma separated: .bin, .npy, .txt, .jpg/.jpeg/.png.")(f)


def _open(model_file, board, token, ssh, tls, as_json):
    """The backend the flags name: in-process, one board, SSH, or every board of a list (a farm)."""
    from bpuemu.board.connect import open_backend
    from bpuemu.board.farm import parse_boards

    boards = parse_boards(board)  # --ssh with --board is refused by the ssh option group already
    if as_json and len(boards) > 1:
        raise click.UsageError("--json takes one board; several boards print the farm's console text")
    return open_backend(split_list(model_file), board=boards, token=token, ssh=ssh, tls=tls)


def _random_inputs(handle):
    from bpuemu.common.input_types import random_rt_inputs

    return random_rt_inputs(handle.model.input_specs)


def _inputs(handle, input_file):
    from bpuemu.board.runtime.inputs import read_inputs

    files = split_list(input_file)
    return read_inputs(files, handle.model.input_specs) if files else []


class _InputsOrRandom:
    """infer's inputs for a board: --input_file's, else random ones (said once on stderr)."""

    def __init__(self, input_file: str):
        self.input_file = input_file
        self.noted = threading.Lock()

    def __call__(self, handle):
        inputs = _inputs(handle, self.input_file)
        if inputs:
            return inputs
        if self.noted.acquire(blocking=False):
            click.echo("no --input_file given: using random inputs", err=True)
        return _random_inputs(handle)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("hrt_model_exec", "-v", "--version", version=f"{__version__} ({RUNTIME_VERSION})")
def cli():
    """Run, inspect and measure BPU models (emulated by bpuemu)."""


@_command("model_info")
@json_option
@march_option
def model_info(model_file, model_name, core_id, board, token, ssh, tls, as_json, march):
    """Print input and output tensor properties."""
    _set_march(march, board, ssh)
    from bpuemu.board.cli.hrt_model_exec_text import board_header, model_info_text

    with _open(model_file, board, token, ssh, tls, as_json) as be:
        run = be.model_info(model_name)
        if as_json:
            run.raise_if_failed()
            board = run.outcomes[0].value
            return _json("model_info", board.backend, models=[{"name": h.name, "inputs": h.input_names,
                                                               "outputs": h.output_names} for h in board.handles])
        for o in run.ok:
            if len(run.outcomes) > 1:
                click.echo(board_header(o.value.backend))
            click.echo(model_info_text([h.model for h in o.value.handles], o.value.backend.description,
                                       o.value.backend.load_ms))
    run.raise_if_failed()


@_command("infer")
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
@timing_option
@march_option
def infer(model_file, model_name, core_id, board, token, ssh, tls, input_file, frame_count, enable_dump, dump_format,
          dump_precision, dump_txt_axis, dump_intermediate, dump_path, as_json, timing, march):
    """Run inference on the given inputs (random ones when none are given)."""
    _set_timing(timing, board, ssh)
    _set_march(march, board, ssh)
    from bpuemu.board.runtime.dump import DumpConfig
    from bpuemu.board.cli.hrt_model_exec_text import agreement_text, board_header, infer_text

    dump = DumpConfig(enable_dump, dump_format, dump_precision, dump_txt_axis, dump_intermediate)
    with _open(model_file, board, token, ssh, tls, as_json) as be:
        run = be.infer(model_name, _InputsOrRandom(input_file), frame_count, dump, dump_path)
        if as_json:
            from bpuemu.common.exec_json import tensor

            run.raise_if_failed()
            b = run.outcomes[0].value
            result = b.result

            def rel(files):
                return [os.path.relpath(f, dump_path) for f in files]

            return _json("infer", b.backend, model=b.handle.name, latency_ms=result.latency_ms,
                         outputs=[tensor(n, a, rel(b.output_files.get(n, []))) for n, a in result.outputs.items()],
                         intermediates=[tensor(n, result.intermediates[n], rel(f))
                                        for n, f in b.intermediate_files.items()])
    for o in run.ok:
        b = o.value
        if len(run.outcomes) > 1:
            click.echo(board_header(b.backend))
        click.echo(infer_text(b.handle.name, b.result.outputs, b.result.latency_ms))
        if b.files:
            click.echo(f"dumped {len(b.files)} file(s) to {os.path.abspath(b.directory)}")
    if run.agreement is not None:
        click.echo(agreement_text(run.agreement))
    run.raise_if_failed()


@_command("perf")
@input_option
@click.option("--frame_count", default=200, show_default=True, type=click.IntRange(1), help="Frames to run when perf_time is 0.")
@click.option("--perf_time", default=0.0, show_default=True, type=click.FloatRange(0), help="Run this many minutes (0: use frame_count).")
@click.option("--thread_num", default=1, show_default=True, type=click.IntRange(1, 8), help="Threads running frames.")
@click.option("--profile_path", default="", help="Directory for profiler.log and profiler.csv (off when empty).")
@json_option
@timing_option
@march_option
def perf(model_file, model_name, core_id, board, token, ssh, tls, input_file, frame_count, perf_time, thread_num,
         profile_path, as_json, timing, march):
    """Measure latency and frame rate on the board itself (on every board of a farm at once), and show what an
    RDK X5 would measure (bpuemu's X5 timing model stored in the .bin by makertbin)."""
    from bpuemu.board.runtime.perf_job import PerfConfig, x5_summary, x5_text

    _set_timing(timing, board, ssh)
    _set_march(march, board, ssh)
    from bpuemu.board.cli.hrt_model_exec_text import board_header, farm_perf_text

    config = PerfConfig(frame_count=frame_count, perf_time_minutes=perf_time, thread_num=thread_num,
                        core_id=core_id, profile=bool(profile_path))
    with _open(model_file, board, token, ssh, tls, as_json) as be:
        n = len(be.boards())
        with _progress(frame_count * n if perf_time == 0 else 0) as progress:
            run = be.perf(model_name, config, lambda h: _inputs(h, input_file), progress, profile_path)
        if as_json:
            run.raise_if_failed()
            b = run.outcomes[0].value
            return _json("perf", b.backend, model=b.handle.name, result=b.report.summary(),
                         profiler_files=b.profile_files, x5=x5_summary(b.handle.model, thread_num, b.report.frame_count))
    for o in run.ok:
        if n > 1:
            click.echo(board_header(o.value.backend))
        paced = _paced(timing, bool(board or ssh), o.value.handle.model)
        click.echo(f"Host figures: measured on {o.value.backend.description} by bpuemu's emulated runtime ({paced}):")
        click.echo(o.value.report.console())
        click.echo(x5_text(o.value.handle.model, thread_num, o.value.report.frame_count))
    if n > 1:
        click.echo(farm_perf_text(run))
    if profile_path and run.ok:
        where = os.path.abspath(profile_path) + ("/<board>" if n > 1 else "")
        click.echo(f"profiler data written to {os.path.join(where, 'profiler.log')} and profiler.csv")
    run.raise_if_failed()


def _paced(timing: str, remote: bool, model) -> str:
    """What the host figures' speed is: this (or the board's) machine, or the modeled board of the model's march
    (the X5, or a J6 march's X5 model scaled per March.timing)."""
    from bpuemu.common.march import march as march_of

    m = march_of(model.march or None)
    if not m.is_j6:
        board = "the X5's"
        if timing == "x5":
            return "paced to the X5 model by --timing x5"
    else:
        board = f"the modeled {m.name}'s ({m.platform}; the X5 model scaled, assumed)"
        if timing == "x5":
            return f"paced to the modeled {m.name} ({m.platform}; the X5 model scaled, assumed) by --timing x5"
    if remote:
        return f"that machine's speed, not {board}, unless it runs hrt_boardd --timing x5"
    return f"this machine's speed, not {board}"


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
