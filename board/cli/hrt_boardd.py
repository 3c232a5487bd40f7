"""hrt_boardd: serve the emulated BPU runtime over gRPC.

    hrt_boardd --listen 127.0.0.1:9473 --model-dir ./models
    hrt_boardd --listen 0.0.0.0:9473 --token-file board.token \
        --tls-cert board.pem --tls-key board.key [--tls-ca clients-ca.pem] \
        [--metrics-listen 0.0.0.0:9474]

Beyond loopback a token is required and TLS recommended; --tls-ca turns on
mTLS (clients must present a certificate signed by that CA).
"""
import signal
import threading

import click

from bpuemu.common.version import __version__
from bpuemu.common.wire import DEFAULT_PORT
from bpuemu.board.cli.edge import run
from bpuemu.board.cli.logs import DAEMON_FORMAT, setup_logging
from bpuemu.board.daemon.state import Limits
from bpuemu.board.security import ServerTls, read_token_file


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hrt_boardd")
@click.option("--listen", default=f"127.0.0.1:{DEFAULT_PORT}", show_default=True,
              help="HOST:PORT to serve on (port 0 picks a free one). Beyond loopback needs --token-file.")
@click.option("--model-dir", default="./hrt_boardd_models", show_default=True, type=click.Path(file_okay=False),
              help="Model store: uploaded .bin files, kept by SHA-256.")
@click.option("--token-file", default="", help="File holding the token callers must present.")
@click.option("--tls-cert", default="", metavar="FILE", help="Serve TLS with this certificate (PEM); needs --tls-key.")
@click.option("--tls-key", default="", metavar="FILE", help="Private key of --tls-cert (PEM).")
@click.option("--tls-ca", default="", metavar="FILE",
              help="Require client certificates signed by this CA (mTLS); needs --tls-cert.")
@click.option("--max-model-mb", default=1024, show_default=True, type=click.IntRange(1), help="Largest model upload accepted.")
@click.option("--max-jobs", default=4, show_default=True, type=click.IntRange(1), help="Infer/perf calls running at once.")
@click.option("--max-uploads", default=4, show_default=True, type=click.IntRange(1), help="Uploads of distinct models in progress at once (more uploads of one model wait for the first).")
@click.option("--max-data-connections", default=64, show_default=True, type=click.IntRange(1),
              help="Open infer data channel connections.")
@click.option("--max-frame-count", default=1_000_000, show_default=True, type=click.IntRange(1), help="Cap on frame_count.")
@click.option("--max-perf-time", default=60.0, show_default=True, type=click.FloatRange(0, min_open=True), help="Cap on perf_time (minutes).")
@click.option("--data-channel/--no-data-channel", default=True, show_default=True,
              help="Also serve infer on a TCP port of its own, TLS when gRPC is (lower latency than gRPC; "
                   "clients fall back when unreachable).")
@click.option("--follow-client-cpu/--no-follow-client-cpu", default=True, show_default=True,
              help="Run a data channel call from a client on this machine on the CPU its request came from, when "
                   "it is the only connection and nothing else runs (the client waits on that CPU): on an idle "
                   "machine neither end then wakes an idle core.")
@click.option("--call-deadline", default=60.0, show_default=True, type=click.FloatRange(1),
              help="Seconds a caller has to send a request (an upload, an infer on the data channel) and to take "
                   "its reply, plus one second per MiB; past it the call ends (DEADLINE_EXCEEDED) and its "
                   "connection is closed, however slowly the bytes came.")
@click.option("--metrics-listen", default="", metavar="HOST:PORT",
              help="Serve Prometheus metrics on http(s)://HOST:PORT/metrics (off by default). Same rules as "
                   "--listen: beyond loopback it needs --token-file (scrapers send 'Authorization: Bearer TOKEN'); "
                   "with --tls-cert it is HTTPS.")
@click.option("--port-file", default="", help="Write the port actually bound to this file (useful with port 0).")
@click.option("--timing", default="host", show_default=True, type=click.Choice(["host", "x5"]),
              help="x5: infer and perf frames last at least their modeled RDK X5 time (all calls share one modeled "
                   "BPU; the model's X5 timing comes from makertbin), so applications see the board's latency and "
                   "throughput; host: as fast as this machine runs.")
@click.option("--march", default="bayes-e", show_default=True, metavar="MARCH",
              help="The board's BPU march: bayes-e (the X5, .bin) or nash-e/m/b/h/p (the J6, .hbm). A model compiled "
                   "for another march is refused at load.")
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def cli(listen, model_dir, token_file, tls_cert, tls_key, tls_ca, max_model_mb, max_jobs, max_uploads,
        max_data_connections, max_frame_count, max_perf_time, data_channel, follow_client_cpu, call_deadline,
        metrics_listen, port_file, timing, march, log_level):
    """Serve the emulated BPU runtime (hrt_boardd)."""
    from bpuemu.board.daemon.memory import limit_arenas

    limit_arenas()  # before the daemon's threads: each would otherwise get a malloc arena of its own
    from bpuemu.board.daemon.server import BoardServer  # grpc import kept off --help

    if bool(tls_cert) != bool(tls_key):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if tls_ca and not tls_cert:
        raise click.UsageError("--tls-ca (client certificates) needs TLS: give --tls-cert and --tls-key too")
    setup_logging(log_level, fmt=DAEMON_FORMAT)
    from bpuemu.board.runtime.model import set_timing

    set_timing(timing)
    from bpuemu.board.runtime import set_board_march

    march = set_board_march(march)   # an unknown name: one line from the CLI edge
    limits = Limits(max_model_bytes=max_model_mb << 20, max_jobs=max_jobs, max_uploads=max_uploads,
                    max_data_connections=max_data_connections, max_frame_count=max_frame_count,
                    max_perf_time_minutes=max_perf_time, call_deadline_s=call_deadline)
    tls = ServerTls(tls_cert, tls_key, tls_ca) if tls_cert else None
    server = BoardServer(listen, model_dir, limits, token=read_token_file(token_file) or None,
                         data_channel=data_channel, tls=tls, metrics_listen=metrics_listen,
                         follow_client_cpu=follow_client_cpu).start()
    if port_file:  # whole or not there: a script polling for it never reads half a port number
        from bpuemu.common.atomic import write_file_atomic

        write_file_atomic(port_file, f"{server.port}\n")
    click.echo(f"hrt_boardd {__version__} ({march}) listening on {server.target}", err=True)
    stopping = threading.Event()

    def on_signal(signum, frame):
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stopping.wait()
    click.echo("hrt_boardd: shutting down (finishing running calls)", err=True)
    server.stop(grace=5.0)


def main(args=None):
    run(cli, "hrt_boardd", args, grpc_core_log=True)


if __name__ == "__main__":
    main()
