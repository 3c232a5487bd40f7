"""Probe an hrt_boardd through grpc.health.v1: ``check`` returns the status its health service reports.

Its command line is bpuemu.board.cli.healthcheck, which deploy/ runs as
``python -m bpuemu.board.daemon.healthcheck`` (exit 0 when the board is SERVING, 1 otherwise).

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

from bpuemu.common.errors import BoardUnavailable
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

