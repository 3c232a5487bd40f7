"""Probe an hrt_boardd through grpc.health.v1: exit 0 when it is SERVING, 1 otherwise.

    python -m bpuemu.board.daemon.healthcheck [--target 127.0.0.1:9473] [--service NAME] [--timeout 3]

For container and service managers that run a command as their health check
(Docker's HEALTHCHECK, a systemd ExecStartPost, a shell script). Kubernetes
probes the same service natively (``grpc:`` probes) and needs no command. The
health service answers without the board's token, so the probe needs none.
It fails fast (no waiting for the board to come up): the caller's retry
policy decides how long a board may take to start. A board serving TLS is
probed with the TLS flags every client takes (--tls-ca, and --tls-cert
--tls-key for mTLS), or the BPUEMU_TLS_* variables.
"""
from typing import Optional

import click

from bpuemu.common.errors import BoardUnavailable
from bpuemu.common.version import __version__
from bpuemu.common.wire import DEFAULT_PORT
from bpuemu.board.cliutil import main_entry
from bpuemu.board.security import TlsConfig


def check(target: str, service: str = "", timeout: float = 3.0, tls: Optional[TlsConfig] = None) -> str:
    """The grpc.health.v1 status name of ``service`` at ``target`` (SERVICE_UNKNOWN for an unknown service).

    Raises BoardUnavailable when the board does not answer within ``timeout``.
    """
    import grpc  # kept off --help
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if tls is None:
        channel = grpc.insecure_channel(target)
    else:
        channel = grpc.secure_channel(target, tls.grpc_credentials(), options=tls.channel_options())
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return "SERVICE_UNKNOWN"
            details = (exc.details() or "no answer").splitlines()[0]
            raise BoardUnavailable(f"hrt_boardd at {target} did not answer the health check: {exc.code().name}: {details}",
                                   hint="is hrt_boardd running and listening there?") from None
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hrt_boardd-healthcheck")
@click.option("--target", default=f"127.0.0.1:{DEFAULT_PORT}", show_default=True, metavar="HOST:PORT",
              help="The board daemon's gRPC address.")
@click.option("--service", default="", help="Service to ask about (\"\": the whole server).")
@click.option("--timeout", default=3.0, show_default=True, type=click.FloatRange(0, min_open=True), help="Seconds to wait.")
@click.option("--tls-ca", default="", metavar="FILE", help="Speak TLS; trust boards signed by this CA.")
@click.option("--tls-cert", default="", metavar="FILE", help="Client certificate for a board that requires one (mTLS).")
@click.option("--tls-key", default="", metavar="FILE", help="Private key of --tls-cert.")
@click.option("--tls-server-name", default="", metavar="NAME", help="Name to check the board's certificate against.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing when the board is SERVING.")
def cli(target, service, timeout, tls_ca, tls_cert, tls_key, tls_server_name, quiet):
    """Exit 0 when the hrt_boardd at TARGET reports SERVING, 1 otherwise."""
    tls = TlsConfig.from_options(tls_ca, tls_cert, tls_key, tls_server_name)
    status = check(target, service, timeout, tls)
    if status != "SERVING":
        raise BoardUnavailable(f"hrt_boardd at {target} reports {status}" + (f" for service '{service}'" if service else ""))
    if not quiet:
        click.echo(f"{target}: SERVING")


def main(args=None):
    main_entry(cli, "hrt_boardd-healthcheck", args)


if __name__ == "__main__":
    main()
