"""Build, start and stop an hrt_boardd gRPC server.

    server = BoardServer("127.0.0.1:0", model_dir)   # port 0: pick a free one
    server.start(); print(server.port)
    ...
    server.stop(grace=5)

Also serves grpc.health.v1 (service "" and "bpuemu.board.v1.Board") and
server reflection.

Metrics: ``metrics_listen="HOST:PORT"`` also serves Prometheus metrics there
(bpuemu.board.daemon.metrics), under the same rule and with the same token and TLS.

Workers. At most ``max_workers`` calls run at once (gRPC's
maximum_concurrent_rpcs, each with a worker thread of its own: none waits in a
queue); one more is refused at once with RESOURCE_EXHAUSTED. A call's request
must come within --call-deadline, and one peer may hold at most a quarter of
the workers with calls whose request is late (bpuemu.board.daemon.interceptor):
an idle client cannot take them all. A connection without calls is
closed after ``connection_idle_s`` and any connection is asked to go after
``connection_age_s`` (its calls then have the longest a call may take to end).
Health watches hold no worker.

Security: listening beyond loopback requires a token (``token``); TLS
(``tls=ServerTls(cert, key[, client_ca])``, mTLS with a client CA) is
recommended there too, and its absence is logged as a warning. With TLS the
infer data channel is TLS as well (see bpuemu.board.daemon.datachannel).
"""
import logging
import socket
from concurrent import futures
from typing import Optional

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from bpuemu.common.errors import InvalidInput, PermissionDenied
from bpuemu.common.proto import board_pb2, board_pb2_grpc
from bpuemu.common.wire import CHANNEL_OPTIONS, is_loopback_host, join_target, split_target
from bpuemu.board.daemon.datachannel import DataChannelServer
from bpuemu.board.daemon.interceptor import AuthFailures, ErrorInterceptor, MetricsInterceptor, TokenInterceptor
from bpuemu.board.daemon.service import BoardService
from bpuemu.board.daemon.state import BoardState, Limits
from bpuemu.board.security import ServerTls

log = logging.getLogger("bpuemu.board.daemon")
SERVICE_NAME = board_pb2.DESCRIPTOR.services_by_name["Board"].full_name


def connection_options(limits: Limits, connection_idle_s: float, connection_age_s: float) -> list:
    """gRPC server options bounding what one connection holds: its concurrent calls, its idle time, its age."""
    longest_call_s = limits.max_perf_time_minutes * 60 + limits.transfer_s(0)
    return [
        ("grpc.max_connection_idle_ms", int(connection_idle_s * 1000)),
        ("grpc.max_connection_age_ms", int(connection_age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", int(longest_call_s * 1000)),
    ]


class BoardServer:
    def __init__(
        self,
        listen: str,
        model_dir: str,
        limits: Optional[Limits] = None,
        token: Optional[str] = None,
        max_workers: int = 64,
        intra_op_threads: int = 1,
        data_channel: bool = True,
        tls: Optional[ServerTls] = None,
        metrics_listen: str = "",
        follow_client_cpu: bool = True,
        connection_idle_s: float = 600.0,
        connection_age_s: float = 3600.0,
    ):
        try:
            host, port = split_target(listen)
            socket.getaddrinfo(host, port)
        except ValueError as exc:
            raise InvalidInput(f"--listen {listen}: {exc}") from None
        except OSError:
            raise InvalidInput(f"--listen {listen}: cannot resolve host '{host}'",
                               hint="use HOST:PORT, e.g. 127.0.0.1:9473") from None
        if not is_loopback_host(host) and not token:
            raise PermissionDenied(
                f"refusing to listen on {host}, beyond loopback, without authentication",
                hint="give --token-file FILE (clients pass the same file), or listen on 127.0.0.1",
            )
        if not is_loopback_host(host) and tls is None:
            log.warning("listening on %s beyond loopback without TLS: the token and all data cross the network "
                        "in clear; give --tls-cert/--tls-key (and --tls-ca for client certificates)", host)
        credentials = tls.grpc_credentials() if tls is not None else None  # checks the files first
        self.tls, self._token = tls, token
        self.state = BoardState(model_dir, limits, intra_op_threads)
        self.metrics = self._metrics_server = None
        failures = AuthFailures()
        if metrics_listen:  # its own refusals (beyond loopback without a token, a port in use) come first
            from bpuemu.board.daemon.metrics import Metrics, MetricsServer  # prometheus_client only when asked for

            self.metrics = failures.metrics = Metrics(self.state)
            self._metrics_server = MetricsServer(metrics_listen, self.metrics, token,
                                                 ssl_context=tls.ssl_context() if tls else None, failures=failures)
        interceptors = [MetricsInterceptor(self.metrics)] if self.metrics else []
        if token:
            interceptors.append(TokenInterceptor(token, failures))
        interceptors.append(ErrorInterceptor(self.state.limits.call_deadline_s, stalled_per_peer=max(1, max_workers // 4)))
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="hrt_boardd"),
            interceptors=interceptors,
            # gRPC sets SO_REUSEPORT by default: a second daemon on a busy port would
            # then start and silently share connections with the first.
            options=CHANNEL_OPTIONS + [("grpc.so_reuseport", 0)]
            + connection_options(self.state.limits, connection_idle_s, connection_age_s),
            maximum_concurrent_rpcs=max_workers,  # every call admitted has its worker: none queues
        )
        self._data = DataChannelServer(host, self.state, token, ssl_context=tls.ssl_context() if tls else None,
                                       metrics=self.metrics, follow_client_cpu=follow_client_cpu,
                                       failures=failures) \
            if data_channel else None
        board_pb2_grpc.add_BoardServicer_to_server(BoardService(self.state, self._data.port if self._data else 0), self._server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server)
        self.host = host
        try:
            address = join_target(host, port)
            self.port = (self._server.add_secure_port(address, credentials) if credentials is not None
                         else self._server.add_insecure_port(address))
        except RuntimeError as exc:
            self._close_data()
            raise InvalidInput(f"cannot listen on {join_target(host, port)}: {exc}",
                               hint="is another hrt_boardd using that port? pick another with --listen") from None
        if not self.port:
            self._close_data()
            raise InvalidInput(f"cannot listen on {join_target(host, port)}", hint="is the port in use?")

    def _close_data(self) -> None:
        if self._data is not None:
            self._data.server_close()
        if self._metrics_server is not None:
            self._metrics_server.server_close()

    @property
    def target(self) -> str:
        return join_target(self.host, self.port)

    def start(self) -> "BoardServer":
        self._server.start()
        if self._data is not None:
            self._data.start()
        if self._metrics_server is not None:
            self._metrics_server.start()
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        security = ("token" if self._token else "no token") + ", " + \
            ("no TLS" if self.tls is None else ("mTLS" if self.tls.mutual else "TLS"))
        log.info("hrt_boardd serving on %s (%s), models in %s", self.target, security, self.state.store.root)
        return self

    def stop(self, grace: Optional[float] = 5.0) -> None:
        self._health.enter_graceful_shutdown()
        if self._data is not None:
            self._data.stop()
        if self._metrics_server is not None:
            self._metrics_server.stop()
        self._server.stop(grace).wait()

    def wait(self) -> None:
        self._server.wait_for_termination()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop(grace=1.0)
