"""The infer data channel: InferRequest/InferReply over TCP (framing in bpuemu.common.wire).

gRPC from Python costs ~0.5 ms a call on loopback, several times a frame's
transfer; this channel carries the same messages at close to raw TCP cost.
It listens on the gRPC listen host, on a port of its own (BoardInfo.data_port),
applies the same token check (in constant time) and the same infer code and
limits, and reports errors as the gRPC status names the gRPC path would use.

Security. The channel follows the daemon's gRPC transport:

- With TLS (hrt_boardd --tls-cert/--tls-key), the channel is TLS too: each
  connection is wrapped with ``ssl`` using the same certificate and key, and,
  with --tls-ca, requires a client certificate signed by that CA (mTLS), just
  as gRPC does. Clients that use TLS for gRPC use it here with the same files
  and the same name check. We wrap rather than disable the channel so that a
  secured board keeps its fast path (TLS adds a handshake per connection, not
  per call). A client that cannot complete the handshake falls back to gRPC,
  which then reports the real problem.
- The token is checked in the HELLO frame, with ``hmac.compare_digest``,
  before anything else is read; a connection that has not finished its TLS
  handshake and HELLO within ``HELLO_TIMEOUT_S`` (in all, however slowly the
  bytes come) is closed.
- At most ``Limits.max_data_connections`` connections are open at once; one
  more gets a RESOURCE_EXHAUSTED ERROR frame and is closed.

The client's CPU. A client on this machine (a loopback peer) calling alone
keeps its thread on one CPU while it waits (bpuemu.board.client); the
connection's thread runs the frame on the CPU the request came from
(SO_INCOMING_CPU), when it is the board's only data channel connection and no
other job runs, and on all the daemon's CPUs otherwise. So each end wakes the
other on a CPU that is busy with the call, never one that went idle: on an idle
machine waking an idle core is slow (on a virtual machine with cpuidle haltpoll
and guest_halt_poll_ns=0 it halts at once). ``hrt_boardd
--no-follow-client-cpu`` turns it off.

A client that goes away mid-call (closed, reset, killed) stops its infer
between two frames, as a cancelled gRPC Infer does: a long frame_count does
not hold a job slot for a caller that is gone.

Deadlines. Every part of a call the client paces has a deadline for the whole
of it, not for each read or write, so a client that trickles its bytes (or
reads the reply a byte at a time) cannot hold a connection and its thread: a
connection idle between calls is closed after ``idle_timeout_s``; once a
request's header has come, its whole request must arrive, and later its whole
reply must be taken, each within ``Limits.transfer_s(bytes)`` (hrt_boardd
--call-deadline SECONDS, plus a second per MiB). Past a deadline the connection
is closed; the infer itself is bounded by --max-frame-count and stops when the
client goes.
"""
import hmac
import logging
import os
import select
import socket
import socketserver
import ssl
import threading
import time
from typing import Optional

from google.protobuf.message import DecodeError

from bpuemu.common.errors import BpuEmuError, InvalidInput
from bpuemu.common.wire import (
    ERROR, HELLO, HELLO_OK, INFER, MAX_MESSAGE_BYTES, FrameReader, FrameWriter, is_loopback_address, pack_frame,
)
from bpuemu.board.messages import ReplyFrames, RequestParser
from bpuemu.board.daemon.state import BoardState

log = logging.getLogger("bpuemu.board.daemon")

#: Seconds a new connection has to finish its TLS handshake and send HELLO.
HELLO_TIMEOUT_S = 10.0
#: Seconds a connection may stay idle between two calls.
IDLE_TIMEOUT_S = 600.0
#: Requests up to this size are read into one buffer the connection keeps (no allocation per call).
REUSED_BUFFER_BYTES = 16 << 20
#: getsockopt(SOL_SOCKET, SO_INCOMING_CPU): the CPU that received the socket's last packet (Linux >= 3.19).
SO_INCOMING_CPU = getattr(socket, "SO_INCOMING_CPU", 49)


def _peer_connected(sock) -> bool:
    """False once the client has closed or reset the connection (checked between frames).

    A peek at the TCP stream, without waiting and without consuming anything (for a
    TLS socket too: the raw bytes stay for the TLS layer). The client sends nothing
    while it waits for its reply, so anything but EOF or an error means it is there.
    """
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        if not poller.poll(0):
            return True
        # Only when readable: a socket with a timeout would otherwise wait for data, MSG_DONTWAIT or not.
        return socket.socket.recv(sock, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


class _Handler(socketserver.BaseRequestHandler):
    server: "DataChannelServer"

    def handle(self):
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.server.hello_timeout_s)  # the TLS handshake's (and a refusal's) deadline, in all
        server = self.server
        if not server.connections.acquire(blocking=False):
            self._refuse(sock, b"RESOURCE_EXHAUSTED\nboard is busy: %d data channel connections already open"
                         % server.state.limits.max_data_connections)
            return
        with server.count_lock:
            server.open_connections += 1
        try:
            self._serve(sock)
        finally:
            with server.count_lock:
                server.open_connections -= 1
            server.connections.release()

    def _refuse(self, sock, message: bytes) -> None:
        try:
            if self.server.ssl_context is not None:
                sock = self.server.ssl_context.wrap_socket(sock, server_side=True)
            sock.sendall(pack_frame(ERROR, message))
        except (OSError, ValueError) as exc:
            log.debug("data channel from %s refused: %s", self.client_address, exc)

    def _serve(self, sock):
        server = self.server
        deadline = time.monotonic() + server.hello_timeout_s
        call_started = None  # a call's start, while one is under way
        try:
            if server.ssl_context is not None:
                sock = server.ssl_context.wrap_socket(sock, server_side=True)
            # Requests up to REUSED_BUFFER_BYTES are read into one buffer the connection keeps (no allocation
            # per call); the inputs view it until the reply is sent.
            reader = FrameReader(sock, keep_bytes=REUSED_BUFFER_BYTES, size=4096)
            writer = FrameWriter(sock)
            kind, token = reader.frame(deadline, max_bytes=4096)
            if kind != HELLO or not hmac.compare_digest(bytes(token), server.token):
                writer.send([pack_frame(ERROR, b"UNAUTHENTICATED\nwrong or missing token on the data channel")],
                            deadline)
                return
            writer.send([pack_frame(HELLO_OK)], deadline)
            requests, replies = RequestParser(), ReplyFrames()  # this connection's stream of calls
            transfer_s, idle_s, infer = server.state.limits.transfer_s, server.idle_timeout_s, self._infer
            follow = server.cpus is not None and is_loopback_address(self.client_address[0])
            on_cpu = None  # the one CPU this thread runs on, while it follows its client's

            def is_active():
                return _peer_connected(sock)

            while True:
                kind, length = reader.header(time.monotonic() + idle_s)
                call_started = time.perf_counter()
                if follow:
                    on_cpu = server.place(sock, on_cpu)
                if kind != INFER or length > MAX_MESSAGE_BYTES:
                    if kind == INFER:
                        raise ValueError(f"bad frame header ({length} bytes)")
                    writer.send([pack_frame(ERROR, b"INVALID_ARGUMENT\nonly INFER frames may follow HELLO")],
                                time.monotonic() + transfer_s(0))
                    return
                payload = reader.payload(length, time.monotonic() + transfer_s(length))
                reply, size, code = infer(requests, replies, payload, is_active)
                writer.send(reply, time.monotonic() + transfer_s(size))
                del payload, reply  # nothing views the kept buffer when the next request comes into it
                if server.metrics is not None:
                    server.count_call(code, call_started)
                call_started = None
        except socket.timeout:  # a deadline passed: the connection goes, the daemon serves on
            if call_started is not None:
                log.info("data channel from %s closed: a call not done within its deadline (--call-deadline %g s "
                         "plus 1 s per MiB)", self.client_address[0], server.state.limits.call_deadline_s)
                server.count_call("DEADLINE_EXCEEDED", call_started)
            else:
                log.debug("data channel from %s closed: no HELLO, or idle, past its deadline", self.client_address[0])
        except (ConnectionError, OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            log.debug("data channel from %s closed: %s", self.client_address, exc)
            if call_started is not None:
                server.count_call("CANCELLED", call_started)
        finally:
            if sock is not self.request:
                sock.close()

    def _infer(self, requests: RequestParser, replies: ReplyFrames, payload: memoryview, is_active) -> tuple:
        """(the reply frame as buffers for FrameWriter.send, its size in bytes, its status name).

        The inputs are viewed in the received buffer and the outputs sent from their own
        memory (bpuemu.board.messages.RequestParser, ReplyFrames): no copy of a tensor in Python.
        """
        try:
            try:
                sha, model_name, frame_count, dump_intermediate, inputs = requests.call(payload)
            except (ValueError, DecodeError) as exc:
                raise InvalidInput(f"the infer request is not a valid InferRequest: {exc}") from None
            result = self.server.state.infer(sha, model_name, inputs, frame_count, dump_intermediate, is_active)
            return (*replies.parts(result), "OK")
        except BpuEmuError as exc:
            frame = pack_frame(ERROR, f"{exc.grpc_status}\n{exc}".encode())
            return [frame], len(frame), exc.grpc_status
        except Exception as exc:  # a bug: report it like the gRPC interceptor does
            log.exception("data channel infer failed unexpectedly")
            frame = pack_frame(ERROR, f"INTERNAL\ninternal error in Infer: {type(exc).__name__}: {exc}".encode())
            return [frame], len(frame), "INTERNAL"


class DataChannelServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, state: BoardState, token: Optional[str], idle_timeout_s: float = IDLE_TIMEOUT_S,
                 ssl_context: Optional[ssl.SSLContext] = None, hello_timeout_s: float = HELLO_TIMEOUT_S,
                 metrics=None, follow_client_cpu: bool = True):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, 0), _Handler)
        self.state = state
        self.token = (token or "").encode()
        self.idle_timeout_s = idle_timeout_s
        self.hello_timeout_s = hello_timeout_s
        self.metrics = metrics  # a bpuemu.board.daemon.metrics.Metrics, or None
        self.ssl_context = ssl_context
        self.connections = threading.BoundedSemaphore(state.limits.max_data_connections)
        self.open_connections = 0  # past the limit's check
        self.count_lock = threading.Lock()
        # The daemon's CPUs, when a connection's thread may be placed on its client's (None: never).
        cpus = os.sched_getaffinity(0) if follow_client_cpu and hasattr(os, "sched_setaffinity") else None
        self.cpus = cpus if cpus and len(cpus) > 1 else None
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    def place(self, sock, on_cpu: Optional[int]) -> Optional[int]:
        """Run the calling connection thread on the CPU its client's request came from, when it is the only
        connection and no other job runs; on all the daemon's CPUs otherwise. ``on_cpu``: the one CPU it runs
        on now (None: all of them); returns the same after."""
        cpu = None
        if self.open_connections == 1 and not self.state.slots_taken:
            try:
                cpu = sock.getsockopt(socket.SOL_SOCKET, SO_INCOMING_CPU)
            except OSError:  # not on this system
                cpu = None
            if cpu not in self.cpus:  # -1 (not known yet), or a CPU the daemon may not use
                cpu = None
        if cpu != on_cpu:
            try:
                os.sched_setaffinity(0, self.cpus if cpu is None else (cpu,))
            except OSError:  # the CPU went offline: stay as it was
                return on_cpu
        return cpu

    def count_call(self, code: str, started: float) -> None:
        if self.metrics is not None:
            self.metrics.call("Infer", "data", code, time.perf_counter() - started)

    def start(self) -> "DataChannelServer":
        self._thread = threading.Thread(target=self.serve_forever, name="hrt_boardd-data", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
