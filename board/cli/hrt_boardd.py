"""hrt_boardd: serve the emulated BPU runtime over gRPC.

    hrt_boardd --listen 127.0.0.1:9473 --model-dir ./models
    hrt_boardd --listen 0.0.0.0:9473 --token-file board.token \
        --tls-cert board.pem --tls-key board.key [--tls-ca clients-ca.pem] \
        [--metrics-listen 0.0.0.0:9474]

Beyond loopback a token is required and TLS recommended; --tls-ca turns on
mTLS (clients must present a certificate signed by that CA).
"""
import os
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
@click.option("--max-store-mb", default=8192.0, show_default=True, type=click.FloatRange(0),
              help="Total size of the model store; an upload past it removes the least recently used models not "
                   "loaded, or is refused (RESOURCE_EXHAUSTED). 0: no limit.")
@click.option("--max-loaded-models", default=16, show_default=True, type=click.IntRange(1),
              help="Models loaded at once; loading one more unloads the least recently used.")
@click.option("--max-concurrent-rpcs", default=64, show_default=True, type=click.IntRange(1),
              help="gRPC calls served at once, each on a worker thread of its own; one more is refused at once "
                   "(RESOURCE_EXHAUSTED). Calls whose request is late may take a quarter of them per client host.")
@click.option("--max-data-buffer-mb", default=1024, show_default=True, type=click.IntRange(1),
              help="Memory the data channel's large requests (over 16 MiB) of all connections may hold at once; "
                   "a request past it is refused (RESOURCE_EXHAUSTED).")
@click.option("--connection-idle", default=600.0, show_default=True, type=click.FloatRange(1),
              help="Seconds a gRPC connection without calls stays open.")
@click.option("--connection-age", default=3600.0, show_default=True, type=click.FloatRange(1),
              help="Seconds after which a gRPC connection is asked to go (clients reconnect; its calls may end).")
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
                   "BPU; the model's X5 timing comes from makertbin; a J6 .hbm's is scaled per its march, assumed), so "
                   "applications see the board's latency and "
                   "throughput; host: as fast as this machine runs.")
@click.option("--march", default="bayes-e", show_default=True, metavar="MARCH", envvar="BPUEMU_BOARD_MARCH",
              show_envvar=True,
              help="The board's BPU march: bayes-e (the X5, .bin) or nash-e/m/b/h/p (the J6, .hbm). A model compiled "
                   "for another march is refused at load.")
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def cli(listen, model_dir, token_file, tls_cert, tls_key, tls_ca, max_model_mb, max_jobs, max_uploads,
        max_data_connections, max_store_mb, max_loaded_models, max_concurrent_rpcs, max_data_buffer_mb,
        connection_idle, connection_age, max_frame_count, max_perf_time, data_channel, follow_client_cpu, call_deadline,
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
                    max_perf_time_minutes=max_perf_time, call_deadline_s=call_deadline,
                    max_store_bytes=int(max_store_mb * (1 << 20)), max_loaded_models=max_loaded_models,
                    max_data_buffer_bytes=max_data_buffer_mb << 20)
    tls = ServerTls(tls_cert, tls_key, tls_ca) if tls_cert else None
    token = read_token_file(token_file) or None
    if token_file:
        from bpuemu.board.security import warn_if_others_can_read

        warn_if_others_can_read(token_file, "--token-file")
    server = BoardServer(listen, model_dir, limits, token=token,
                         data_channel=data_channel, tls=tls, metrics_listen=metrics_listen,
                         follow_client_cpu=follow_client_cpu, max_workers=max_concurrent_rpcs,
                         connection_idle_s=connection_idle, connection_age_s=connection_age).start()
    if port_file:  # whole or not there: a script polling for it never reads half a port number
        from bpuemu.common.atomic import write_file_atomic

        write_file_atomic(port_file, f"{server.port}\n")
    # Every file the daemon was given is read: from here on it works in a directory that holds nothing but its
    # store, so nothing that resolves a relative path (onnxruntime's external data) finds another file there.
    os.chdir(server.state.store.root)
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
