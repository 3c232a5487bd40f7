"""hrt_model_exec: model_info, infer and perf, in-process or against a board.

    hrt_model_exec model_info --model_file m.bin
    hrt_model_exec infer --model_file m.bin --input_file img.jpg [--board HOST:PORT]
    hrt_model_exec perf  --model_file m.bin --thread_num 2 --frame_count 200 --profile_path .
    hrt_model_exec infer --model_file m.bin --ssh root@board[:22] --identity ~/.ssh/id_ed25519
    hrt_model_exec perf  --model_file m.bin --board a:9473,b:9473 (or @boards.txt) --tls-ca ca.pem

Flags are the real tool's, spelled the same way (``--model_file=a.bin,b.bin``).
Without --board or --ssh the runtime runs in this process: on a board that is
the board itself, on a host it is the x86 simulator. --ssh needs the host
install (the SSH transport is a plugin, see bpuemu.board.backends).
With several boards, perf fans out to all of them (and infer/model_info run on
each): see bpuemu.board.hrt_model_exec.farm_cmd.
"""
import functools
import os
import sys

import click

from bpuemu.common.atomic import write_file_atomic
from bpuemu.common.version import RUNTIME_VERSION, __version__
from bpuemu.board.cliutil import BoolFlag, main_entry

BOOL = BoolFlag()


def _split(value: str):
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _token(token_file: str) -> str:
    from bpuemu.board.security import client_token  # the file, else BPUEMU_TOKEN

    return client_token(token_file) or ""


def model_options(f):
    """Options every subcommand takes: which model, where it runs."""
    opts = [
        click.option("--model_file", required=True, help="Model file(s), comma separated."),
        click.option("--model_name", default="", help="Model to use when the files hold several."),
        click.option("--core_id", default=0, show_default=True, type=click.IntRange(0, 2), help="BPU core (0: any)."),
        click.option("--board", default="", metavar="HOST:PORT[,...]|@FILE",
                     help="Run on the hrt_boardd at HOST:PORT instead of in-process; several boards comma separated, "
                          "or @FILE listing one per line."),
        click.option("--token-file", "token_file", default="", help="Token for a board that requires one (or set BPUEMU_TOKEN)."),
    ]
    f = tls_options(f)
    f = ssh_options(f)  # listed after the options above
    for opt in reversed(opts):
        f = opt(f)
    return f


def ssh_options(f):
    """--ssh and its companions, gathered into one ``ssh`` argument (SshOptions or None)."""

    @functools.wraps(f)
    def wrapper(*args, ssh, password, identity, known_hosts, accept_new_host_key, remote_command, **kwargs):
        if ssh:
            from bpuemu.board.backends import SshOptions

            kwargs["ssh"] = SshOptions(target=ssh, password=password or None, identity=identity or None,
                                       known_hosts=known_hosts or None, accept_new_host_key=accept_new_host_key,
                                       remote_command=remote_command)
        else:
            for flag, value in (("--identity", identity), ("--known-hosts", known_hosts),
                                ("--accept-new-host-key", accept_new_host_key)):
                if value:
                    raise click.UsageError(f"{flag} only applies with --ssh")
            kwargs["ssh"] = None
        return f(*args, **kwargs)

    opts = [
        click.option("--ssh", default="", metavar="USER@HOST[:PORT]",
                     help="Run on a board over SSH (port 22 by default): upload the model, run hrt_model_exec there."),
        click.option("-p", "--password", default="", envvar="BPUEMU_SSH_PASSWORD",
                     help="SSH password (or set BPUEMU_SSH_PASSWORD); omit for key authentication."),
        click.option("--identity", default="", metavar="FILE", help="SSH private key file."),
        click.option("--known-hosts", "known_hosts", default="", metavar="FILE",
                     help="known_hosts file checked for the board's host key [default: ~/.ssh/known_hosts]."),
        click.option("--accept-new-host-key", "accept_new_host_key", is_flag=True,
                     help="Trust and record a board host key that known_hosts lacks (a changed key is always refused)."),
        click.option("--remote-command", "remote_command", default="hrt_model_exec", show_default=True,
                     help="How to run hrt_model_exec on the board."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper


def tls_options(f):
    """--tls-ca/--tls-cert/--tls-key/--tls-server-name, gathered into one ``tls`` argument (TlsConfig or None)."""

    @functools.wraps(f)
    def wrapper(*args, tls_ca, tls_cert, tls_key, tls_server_name, **kwargs):
        from bpuemu.board.security import TlsConfig

        if kwargs.get("ssh") and (tls_ca or tls_cert or tls_key or tls_server_name):
            raise click.UsageError("--tls-* options apply to --board (gRPC), not --ssh")
        kwargs["tls"] = TlsConfig.from_options(tls_ca, tls_cert, tls_key, tls_server_name)
        return f(*args, **kwargs)

    opts = [
        click.option("--tls-ca", "tls_ca", default="", metavar="FILE",
                     help="Use TLS; trust boards whose certificate this CA signed (or set BPUEMU_TLS_CA)."),
        click.option("--tls-cert", "tls_cert", default="", metavar="FILE",
                     help="Client certificate for a board that requires one (mTLS; or set BPUEMU_TLS_CERT)."),
        click.option("--tls-key", "tls_key", default="", metavar="FILE", help="Key of --tls-cert (or set BPUEMU_TLS_KEY)."),
        click.option("--tls-server-name", "tls_server_name", default="", metavar="NAME",
                     help="Name the board's certificate must carry, when not the --board host."),
    ]
    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper


def _farm(board, ssh):
    """The boards of --board when it names several (a farm), else None."""
    if not board or ("," not in board and not board.lstrip().startswith("@")):
        return None
    from bpuemu.board.farm import parse_boards

    boards = parse_boards(board)
    if ssh is not None:
        raise click.UsageError("--ssh takes one board; several boards are for --board (gRPC)")
    return boards if len(boards) > 1 else None


def _access(token_file, tls):
    from bpuemu.board.farm import BoardAccess

    return BoardAccess(token=_token(token_file) or None, tls=tls, client_name="hrt_model_exec")


def input_options(f):
    opts = [
        click.option("--input_file", default="", help="One file per input, comma separated: .bin, .npy, .txt, .jpg/.jpeg/.png."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _open(model_file, board, token_file, ssh=None, tls=None):
    from bpuemu.board.backends import open_backend

    if board and board.lstrip().startswith("@"):  # a board list naming one board
        from bpuemu.board.farm import parse_boards

        board = parse_boards(board)[0]
    return open_backend(_split(model_file), board=board or None, token=_token(token_file) or None, ssh=ssh, tls=tls)


def _random_inputs(handle):
    from bpuemu.common.input_types import random_rt_inputs

    return random_rt_inputs(handle.model.input_specs)


def _inputs(handle, input_file):
    from bpuemu.board.hrt_model_exec.inputs import read_inputs

    files = _split(input_file)
    return read_inputs(files, handle.model.input_specs) if files else []


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(f"{__version__} ({RUNTIME_VERSION})", "-v", "--version", prog_name="hrt_model_exec")
def cli():
    """Run, inspect and measure BPU models (emulated by bpuemu)."""


@cli.command("model_info")
@model_options
def model_info(model_file, model_name, core_id, board, token_file, ssh, tls):
    """Print input and output tensor properties."""
    from bpuemu.board.hrt_model_exec.report import model_info_text

    boards = _farm(board, ssh)
    if boards:
        from bpuemu.board.hrt_model_exec import farm_cmd

        return farm_cmd.model_info(boards, _split(model_file), model_name, _access(token_file, tls))
    with _open(model_file, board, token_file, ssh, tls) as be:
        handles = [be.model(model_name)] if model_name else [be.models[n] for n in be.model_names]
        click.echo(model_info_text([h.model for h in handles], be.description, be.load_ms))


@cli.command("infer")
@model_options
@input_options
@click.option("--frame_count", default=1, show_default=True, type=click.IntRange(1), help="Frames to run.")
@click.option("--enable_dump", default=False, type=BOOL, help="Write the outputs to files.")
@click.option("--dump_format", default="bin", show_default=True, type=click.Choice(["bin", "txt"]))
@click.option("--dump_precision", default=9, show_default=True, type=click.IntRange(0, 20), help="Decimals in txt dumps.")
@click.option("--dump_txt_axis", default=-1, show_default=True, type=int, help="txt dumps: one line per index up to this axis (-1: last).")
@click.option("--dump_intermediate", default=0, show_default=True, type=click.IntRange(0, 3),
              help="Dump every step's inputs and outputs: 1 bin, 2/3 bin and txt.")
@click.option("--dump_path", default=".", show_default=True, type=click.Path(file_okay=False), help="Where dumps go.")
def infer(model_file, model_name, core_id, board, token_file, ssh, tls, input_file, frame_count, enable_dump, dump_format,
          dump_precision, dump_txt_axis, dump_intermediate, dump_path):
    """Run inference on the given inputs (random ones when none are given)."""
    from bpuemu.board.hrt_model_exec import dump
    from bpuemu.board.hrt_model_exec.report import infer_text

    boards = _farm(board, ssh)
    if boards:
        from bpuemu.board.farm import profile_dir
        from bpuemu.board.hrt_model_exec import farm_cmd

        def dumps(target, h, result):  # each board's files in a directory of its own
            where, written = profile_dir(dump_path, target), []
            if enable_dump:
                written += dump.dump_outputs(where, h.name, result.outputs, dump_format, dump_precision, dump_txt_axis)
            if dump_intermediate:
                written += dump.dump_intermediate(where, h.model, result.intermediates, dump_intermediate, dump_precision,
                                                  dump_txt_axis)
            return written

        return farm_cmd.infer(boards, _split(model_file), model_name, _access(token_file, tls),
                              lambda h: _inputs(h, input_file) or _random_inputs(h), frame_count, dump_intermediate > 0,
                              dumps)
    with _open(model_file, board, token_file, ssh, tls) as be:
        h = be.model(model_name)
        inputs = _inputs(h, input_file)
        if not inputs:
            click.echo("no --input_file given: using random inputs", err=True)
            inputs = _random_inputs(h)
        result = h.infer(inputs, frame_count=frame_count, dump_intermediate=dump_intermediate > 0)
        click.echo(infer_text(h.name, result.outputs, result.latency_ms))
        written = []
        if enable_dump:
            written += dump.dump_outputs(dump_path, h.name, result.outputs, dump_format, dump_precision, dump_txt_axis)
        if dump_intermediate:
            written += dump.dump_intermediate(dump_path, h.model, result.intermediates, dump_intermediate, dump_precision, dump_txt_axis)
        if written:
            click.echo(f"dumped {len(written)} file(s) to {os.path.abspath(dump_path)}")


@cli.command("perf")
@model_options
@input_options
@click.option("--frame_count", default=200, show_default=True, type=click.IntRange(1), help="Frames to run when perf_time is 0.")
@click.option("--perf_time", default=0.0, show_default=True, type=click.FloatRange(0), help="Run this many minutes (0: use frame_count).")
@click.option("--thread_num", default=1, show_default=True, type=click.IntRange(1, 8), help="Threads running frames.")
@click.option("--profile_path", default="", help="Directory for profiler.log and profiler.csv (off when empty).")
def perf(model_file, model_name, core_id, board, token_file, ssh, tls, input_file, frame_count, perf_time, thread_num,
         profile_path):
    """Measure latency and frame rate on the board itself (on every board of a farm at once)."""
    from bpuemu.board.runtime.perf import PerfConfig

    config = PerfConfig(frame_count=frame_count, perf_time_minutes=perf_time, thread_num=thread_num,
                        core_id=core_id, profile=bool(profile_path))
    boards = _farm(board, ssh)
    if boards:
        from bpuemu.board.hrt_model_exec import farm_cmd

        return farm_cmd.perf(boards, _split(model_file), model_name, _access(token_file, tls), config,
                             lambda h: _inputs(h, input_file), _progress, profile_path)
    with _open(model_file, board, token_file, ssh, tls) as be:
        h = be.model(model_name)
        inputs = _inputs(h, input_file)
        with _progress(frame_count if perf_time == 0 else 0) as progress:
            report = h.perf(config, inputs, progress=progress)
    click.echo(report.console())
    if profile_path:
        os.makedirs(profile_path, exist_ok=True)
        for name, text in (("profiler.log", report.profiler_log), ("profiler.csv", report.profiler_csv)):
            write_file_atomic(os.path.join(profile_path, name), text)
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
    main_entry(cli, "hrt_model_exec", args)
