"""hrt_boardd: serve the emulated BPU runtime over gRPC.

    hrt_boardd --listen 127.0.0.1:9473 --model-dir ./models
"""
import signal
import threading

import click

from bpuemu.common.errors import InvalidInput
from bpuemu.common.version import __version__
from bpuemu.common.wire import DEFAULT_PORT
from bpuemu.board.cliutil import main_entry, setup_logging
from bpuemu.board.daemon.state import Limits


def read_token(path: str) -> str:
    if not path:
        return ""
    try:
        with open(path) as f:
            token = f.read().strip()
    except OSError as exc:
        raise InvalidInput(f"cannot read token file {path}: {exc.strerror}") from None
    if len(token) < 16:
        raise InvalidInput(f"token in {path} is too short ({len(token)} chars); use at least 16")
    return token


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hrt_boardd")
@click.option("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", show_default=True,
              help="HOST:PORT to serve on (port 0 picks a free one). Beyond loopback needs --token-file.")
@click.option("--model-dir", default="./hrt_boardd_models", show_default=True, type=click.Path(file_okay=False),
              help="Model store: uploaded .bin files, kept by SHA-256.")
@click.option("--token-file", default="", help="File holding the token callers must present.")
@click.option("--max-model-mb", default=1024, show_default=True, type=click.IntRange(1), help="Largest model upload accepted.")
@click.option("--max-jobs", default=4, show_default=True, type=click.IntRange(1), help="Infer/perf calls running at once.")
@click.option("--max-frame-count", default=1_000_000, show_default=True, type=click.IntRange(1), help="Cap on frame_count.")
@click.option("--max-perf-time", default=60.0, show_default=True, type=click.FloatRange(0, min_open=True), help="Cap on perf_time (minutes).")
@click.option("--data-channel/--no-data-channel", default=True, show_default=True,
              help="Also serve infer on a plain TCP port (lower latency than gRPC; clients fall back when unreachable).")
@click.option("--port-file", default="", help="Write the port actually bound to this file (useful with port 0).")
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def cli(listen, model_dir, token_file, max_model_mb, max_jobs, max_frame_count, max_perf_time, data_channel, port_file,
        log_level):
    """Serve the emulated BPU runtime (hrt_boardd)."""
    from bpuemu.board.daemon.server import BoardServer  # grpc import kept off --help

    setup_logging(log_level)
    limits = Limits(max_model_bytes=max_model_mb << 20, max_jobs=max_jobs,
                    max_frame_count=max_frame_count, max_perf_time_minutes=max_perf_time)
    server = BoardServer(listen, model_dir, limits, token=read_token(token_file) or None,
                         data_channel=data_channel).start()
    if port_file:
        with open(port_file, "w") as f:
            f.write(f"{server.port}\n")
    click.echo(f"hrt_boardd {__version__} listening on {server.target}", err=True)
    stopping = threading.Event()

    def on_signal(signum, frame):
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stopping.wait()
    click.echo("hrt_boardd: shutting down (finishing running calls)", err=True)
    server.stop(grace=5.0)


def main(args=None):
    main_entry(cli, "hrt_boardd", args)


if __name__ == "__main__":
    main()
