"""The infer data channel: InferRequest/InferReply over plain TCP (framing in bpuemu.common.wire).

gRPC from Python costs ~0.5 ms a call on loopback, several times a frame's
transfer; this channel carries the same messages at close to raw TCP cost.
It listens on the gRPC listen host, on a port of its own (BoardInfo.data_port),
applies the same token check (in constant time) and the same infer code and
limits, and reports errors as the gRPC status names the gRPC path would use.
"""
import hmac
import logging
import socket
import socketserver
import threading
from typing import Optional

from bpuemu.common.errors import BpuEmuError
from bpuemu.common.proto import board_pb2
from bpuemu.common.wire import ERROR, HELLO, HELLO_OK, INFER, REPLY, pack_frame, read_frame
from bpuemu.board.daemon.service import run_infer
from bpuemu.board.daemon.state import BoardState

log = logging.getLogger("bpuemu.board.daemon")


class _Handler(socketserver.BaseRequestHandler):
    server: "DataChannelServer"

    def handle(self):
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.server.idle_timeout_s)
        try:
            kind, token = read_frame(sock, max_bytes=4096)
            if kind != HELLO or not hmac.compare_digest(bytes(token), self.server.token):
                sock.sendall(pack_frame(ERROR, b"UNAUTHENTICATED\nwrong or missing token on the data channel"))
                return
            sock.sendall(pack_frame(HELLO_OK))
            while True:
                kind, payload = read_frame(sock)
                if kind != INFER:
                    sock.sendall(pack_frame(ERROR, b"INVALID_ARGUMENT\nonly INFER frames may follow HELLO"))
                    return
                sock.sendall(self._infer(payload))
        except (ConnectionError, socket.timeout, OSError, ValueError) as exc:
            log.debug("data channel from %s closed: %s", self.client_address, exc)

    def _infer(self, payload: bytes) -> bytes:
        try:
            request = board_pb2.InferRequest.FromString(payload)
            return pack_frame(REPLY, run_infer(self.server.state, request).SerializeToString())
        except BpuEmuError as exc:
            return pack_frame(ERROR, f"{exc.grpc_status}\n{exc}".encode())
        except Exception as exc:  # a bug: report it like the gRPC interceptor does
            log.exception("data channel infer failed unexpectedly")
            return pack_frame(ERROR, f"INTERNAL\ninternal error in Infer: {type(exc).__name__}: {exc}".encode())


class DataChannelServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, state: BoardState, token: Optional[str], idle_timeout_s: float = 600.0):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, 0), _Handler)
        self.state = state
        self.token = (token or "").encode()
        self.idle_timeout_s = idle_timeout_s
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> "DataChannelServer":
        self._thread = threading.Thread(target=self.serve_forever, name="hrt_boardd-data", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
