"""The gRPC client of a board daemon (hrt_boardd).

    with BoardClient("127.0.0.1:9473") as board:
        print(board.info.arch)
        sha = board.ensure_model("model.bin")          # uploads only if missing
        outputs = board.infer(sha, "", [x]).outputs

One channel per board; every call has a deadline; every failure becomes a
BpuEmuError through one translator (``_translate``) whose message names the
board.

Security: ``token`` (None: $BPUEMU_TOKEN) goes with every call;
``tls=TlsConfig(ca_file, cert_file, key_file, server_name)`` (None: the
BPUEMU_TLS_* variables, else plain TCP) secures the channel and the data
channel alike (bpuemu.board.security).

Several boards: ``BoardClient("10.0.0.1:9473,10.0.0.2:9473")`` opens one
channel over all of them with gRPC's own ``round_robin`` load balancing, so
consecutive calls go to consecutive boards. That client uses gRPC only: the
data channel is a connection to one board and cannot be balanced by gRPC.
Every board must already hold the model (bpuemu.board.farm does that).
"""
import os
import platform
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from bpuemu.common.container import file_sha256
from bpuemu.common.errors import (
    BY_GRPC_STATUS,
    BoardUnavailable,
    BpuEmuError,
    Cancelled,
    DeadlineExceeded,
    IncompatibleVersion,
    InternalError,
    InvalidInput,
    NotFound,
)
from bpuemu.common.proto import board_pb2, board_pb2_grpc, model_pb2
from bpuemu.common.tensor import to_wire
from bpuemu.common.version import API_VERSION, __version__
from bpuemu.common.wire import (
    CHANNEL_OPTIONS,
    ERROR,
    FrameReader,
    FrameWriter,
    HELLO,
    HELLO_OK,
    REPLY,
    TOKEN_METADATA_KEY,
    UPLOAD_CHUNK_BYTES,
    is_loopback_address,
    join_target,
    pack_frame,
    split_target,
)
from bpuemu.board.messages import (
    ZERO_COPY_BYTES,
    ReplyParser,
    RequestFrames,
    infer_request,
    infer_result,
    onnxruntime_version,
    perf_report_from_proto,
)
from bpuemu.board.runtime.infer import InferResult
from bpuemu.board.runtime.perf_job import PerfConfig, PerfReport
from bpuemu.board.security import TlsConfig, client_token, warn_if_token_in_clear


@dataclass
class Deadlines:
    """Seconds each kind of call may take. Perf adds its own run time."""

    connect: float = 10.0
    call: float = 30.0
    infer: float = 120.0
    upload_base: float = 30.0
    upload_bytes_per_s: float = 1e6  # the slowest link one upload attempt allows for, before it is cut and resumed
    upload_stall: float = 15.0  # seconds an upload may go without the board taking a chunk: cut, then resumed
    upload_attempts: int = 10   # attempts of one upload (each resumes where the board is)
    perf_margin: float = 120.0
    perf_frame_budget_s: float = 1.0  # per frame per thread, for frame-bound perf


#: Upload errors after which a resumed attempt may succeed: the link broke (a deadline is final, as for every call).
_RESUMABLE_UPLOAD_CODES = (grpc.StatusCode.UNAVAILABLE,)


@dataclass
class UploadTally:
    """What one BoardClient.upload took: attempts, the offset each started at, bytes sent and lost on the way."""

    size: int
    attempts: int = 0
    offsets: List[int] = field(default_factory=list)
    sent_bytes: int = 0   # data bytes sent, over all attempts
    lost_bytes: int = 0   # of those, bytes a cut attempt sent that the board did not keep
    last_end: int = 0     # the file offset the current attempt has sent up to

    @property
    def resent_bytes(self) -> int:
        """Bytes sent more than once."""
        return max(0, self.sent_bytes - (self.size - (self.offsets[0] if self.offsets else 0)))


def _current_cpu() -> Optional[Callable[[], int]]:
    """libc's sched_getcpu (the CPU the calling thread runs on), where there is one and threads can be placed."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    try:
        import ctypes

        getcpu = ctypes.CDLL(None).sched_getcpu
        getcpu.argtypes, getcpu.restype = (), ctypes.c_int
        return getcpu if getcpu() >= 0 else None
    except (OSError, AttributeError):
        return None


class _DataChannel:
    """A connection to the board's infer data channel (see bpuemu.common.wire).

    A call is one sendmsg of the request (RequestFrames: the inputs from their own memory) and, usually,
    one recv of the whole reply (FrameReader), in the calling thread: no other thread is woken on the way.

    A board on this machine (a loopback address): while a call waits for its reply, its thread is kept on the
    CPU it sent the request from, and given its CPUs back once the reply is in. The board runs the frame on
    that CPU too (hrt_boardd follows its client's CPU, bpuemu.board.daemon.datachannel), so on an idle
    machine neither end wakes a core that went idle: on a virtual machine whose idle cores halt at once
    (cpuidle haltpoll) waking one costs each infer a hypervisor round trip (bench/board_perf.py shows how
    often the cores idled).
    Only while no two data channel calls of this process have been under way together for a second: two
    calls kept on one CPU would wait for each other.
    """

    CONNECT_TIMEOUT_S = 2.0
    #: Seconds after two calls of this process were last under way together during which none is kept on its
    #: CPU (threads that call side by side, even when one of them is between two calls).
    TOGETHER_S = 1.0
    #: Data channel calls under way in this process, over all its clients, and when two last were.
    _calls = 0
    _together_at = -TOGETHER_S
    _calls_lock = threading.Lock()
    _getcpu = _current_cpu()

    def __init__(self, host: str, port: int, token: str, tls: Optional[TlsConfig] = None, keep_cpu: bool = True):
        self.sock = socket.create_connection((host, port), timeout=self.CONNECT_TIMEOUT_S)
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:  # the same files and name check as the gRPC channel
                self.sock = tls.ssl_context().wrap_socket(self.sock, server_hostname=tls.hostname_for(host))
            self.sock.sendall(pack_frame(HELLO, token.encode()))
            # Replies under ZERO_COPY_BYTES are read into one kept buffer (their tensors are copied out);
            # larger ones into their own, which the outputs view.
            self.reader = FrameReader(self.sock, keep_bytes=ZERO_COPY_BYTES - 1)
            self.writer = FrameWriter(self.sock)
            kind, payload = self.reader.frame(time.monotonic() + self.CONNECT_TIMEOUT_S)
            payload = bytes(payload)
        except BaseException:
            self.sock.close()
            raise
        if kind != HELLO_OK:
            self.sock.close()
            raise ConnectionRefusedError(payload.decode(errors="replace"))
        self.requests = RequestFrames()
        self.replies = ReplyParser()
        self.keep_cpu = keep_cpu and self._getcpu is not None and is_loopback_address(self.sock.getpeername()[0])

    def infer(self, args: tuple, timeout: float) -> tuple:
        """(InferResult, None) or (None, (status name, message)). ``args``: infer_request's arguments."""
        deadline = time.monotonic() + timeout
        parts = self.requests.parts(*args)
        if self.keep_cpu:
            kind, payload = self._on_this_cpu(parts, deadline)
        else:
            self.writer.send(parts, deadline)
            kind, payload = self.reader.frame(deadline)
        if kind == REPLY:
            try:
                return self.replies.parse(payload, len(payload) < ZERO_COPY_BYTES), None
            except (ValueError, DecodeError) as exc:
                raise ConnectionError(f"malformed reply: {exc}") from None
        if kind == ERROR:
            status, _, message = bytes(payload).decode(errors="replace").partition("\n")
            return None, (status, message)
        raise ConnectionError(f"unexpected frame kind {kind}")

    def _on_this_cpu(self, parts: list, deadline: float) -> tuple:
        """Send the request and read the reply's frame, the thread kept on its CPU meanwhile when no other data
        channel call of the process has been under way beside one for TOGETHER_S."""
        cls = _DataChannel
        now = time.monotonic()
        with cls._calls_lock:
            cls._calls += 1
            if cls._calls > 1:
                cls._together_at = now
            alone = now - cls._together_at > cls.TOGETHER_S
        cpus = None
        try:
            if alone:
                cpus = os.sched_getaffinity(0)
                if len(cpus) > 1:
                    os.sched_setaffinity(0, (cls._getcpu(),))
                else:
                    cpus = None
            self.writer.send(parts, deadline)
            return self.reader.frame(deadline)
        finally:
            if cpus is not None:
                os.sched_setaffinity(0, cpus)
            with cls._calls_lock:
                if cls._calls > 1:
                    cls._together_at = time.monotonic()
                cls._calls -= 1

    def close(self) -> None:
        self.sock.close()


def _tls_reason(details: str) -> str:
    """The part of gRPC's handshake failure a person can act on."""
    for marker, reason in (("CERTIFICATE_VERIFY_FAILED", "the board's certificate is not signed by the trusted CA"),
                           ("Hostname Verification", "the board's certificate does not name this host"),
                           ("WRONG_VERSION_NUMBER", "the board does not speak TLS"),
                           ("CERTIFICATE_REQUIRED", "the board requires a client certificate"),
                           ("UNKNOWN_CA", "the board does not trust this client certificate")):
        if marker in details:
            return reason
    return ""


def _translate(err: grpc.RpcError, target: str, what: str, tls: Optional[TlsConfig] = None) -> BpuEmuError:
    code = err.code() if hasattr(err, "code") else None
    details = (err.details() if hasattr(err, "details") else "") or ""
    name = code.name if code is not None else "UNKNOWN"
    if name == "UNAVAILABLE":
        first = details.splitlines()[0] if details else "no answer"
        if "ping timeout" in details or "keepalive" in details.lower():  # the connection went silent mid-call
            return BoardUnavailable(f"board {target} stopped answering during {what}: {first}",
                                    hint="the network to the board, or the board itself, hangs")
        if "Stream removed" in details:  # the connection broke mid-call: a crash, a restart, a network cut
            return BoardUnavailable(f"board {target} went away during {what}: {first}",
                                    hint="the daemon may have been restarted or killed; check its log")
        reason = _tls_reason(details)
        if not reason and tls is not None and ("Socket closed" in details or "handshake" in details.lower()):
            # gRPC sees an mTLS refusal only as "Socket closed": say what it most likely means.
            reason = "the board closed the connection during the TLS handshake"
        if reason:
            return BoardUnavailable(
                f"TLS with board {target} failed during {what}: {reason}",
                hint="check the CA that signed the board's certificate, the name the certificate must carry, and, "
                     "for a board that requires client certificates, the client certificate and key",
                subject="tls")
        return BoardUnavailable(f"board {target} is unreachable during {what}: {first}",
                                hint=f"is hrt_boardd running there? start it with: hrt_boardd --listen {target}"
                                     + ("" if tls is not None else "; if it serves TLS, give its CA"),
                                subject="" if tls is not None else "unreachable_plain")
    if name == "DEADLINE_EXCEEDED":
        return DeadlineExceeded(f"board {target} did not answer {what} before its deadline",
                                hint="the board may be overloaded or the job too long", subject="deadline")
    if name == "CANCELLED" and not details:
        return BY_GRPC_STATUS["CANCELLED"](f"{what} on {target} was cancelled")
    cls = BY_GRPC_STATUS.get(name, InternalError)
    message, _, hint = details.partition("\nHint: ")
    return cls(f"board {target}: {message}", hint=hint)


def _parse_address(target: str) -> tuple:
    try:
        return split_target(target)
    except ValueError as exc:
        raise NotFound(f"bad board address '{target}': {exc}", hint="use HOST:PORT, e.g. 127.0.0.1:9473") from None


def round_robin_target(targets: Sequence[str]) -> str:
    """A gRPC multi-address target (``ipv4:a:p,b:p``) over boards given as HOST:PORT.

    Host names are resolved here: gRPC's ipv4:/ipv6: schemes take addresses, and
    all of them must be of one family.
    """
    addresses = []
    for target in targets:
        host, port = _parse_address(target)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise BoardUnavailable(f"cannot resolve board {target}: {exc}") from None
        family, _, _, _, sockaddr = infos[0]
        addresses.append((family, join_target(sockaddr[0], port)))
    families = {f for f, _ in addresses}
    if len(families) > 1:
        raise InvalidInput("a round-robin board list must be all IPv4 or all IPv6 addresses",
                           hint="list the boards by addresses of one family")
    scheme = "ipv6" if families == {socket.AF_INET6} else "ipv4"
    return f"{scheme}:" + ",".join(a for _, a in addresses)


class BoardClient:
    def __init__(self, target: str, token: Optional[str] = None, deadlines: Optional[Deadlines] = None,
                 client_name: str = "bpuemu", data_channel: bool = True, tls: Optional[TlsConfig] = None,
                 keep_cpu: bool = True):
        targets = [t.strip() for t in target.split(",") if t.strip()] if "," in target else [target]
        if not targets:
            raise NotFound(f"bad board address '{target}'", hint="use HOST:PORT, e.g. 127.0.0.1:9473")
        host, port = _parse_address(targets[0])
        token = client_token() if token is None else token
        tls = TlsConfig.from_env() if tls is None else tls
        options = list(CHANNEL_OPTIONS)
        if len(targets) == 1:
            self.target = join_target(host, port)
            channel_target = self.target
        else:  # one channel over several boards, balanced by gRPC itself
            self.target = ",".join(join_target(*_parse_address(t)) for t in targets)
            channel_target = round_robin_target(targets)
            options.append(("grpc.lb_policy_name", "round_robin"))
            data_channel = False
        self.deadlines = deadlines or Deadlines()
        self.tls = tls
        self._metadata = ((TOKEN_METADATA_KEY, f"Bearer {token}"),) if token else ()
        warn_if_token_in_clear([_parse_address(t)[0] for t in targets], token, tls)
        if tls is not None:
            # With several addresses gRPC has no single host name to check: use the first board's host.
            options += tls.channel_options(default_name=host if len(targets) > 1 else "")
            self._channel = grpc.secure_channel(channel_target, tls.grpc_credentials(), options=options)
        else:
            self._channel = grpc.insecure_channel(channel_target, options=options)
        self._stub = board_pb2_grpc.BoardStub(self._channel)
        self.client_name = client_name
        self._info: Optional[board_pb2.BoardInfo] = None
        self._host, self._token = host, token or ""
        self._use_data = data_channel and not os.environ.get("BPUEMU_NO_DATA_CHANNEL")
        self._data: Optional[_DataChannel] = None
        self._data_lock = threading.Lock()
        self._keep_cpu = keep_cpu  # a data channel call to a board on this machine waits on its CPU (_DataChannel)
        self.last_upload: Optional[UploadTally] = None

    # -- plumbing ----------------------------------------------------------
    def _call(self, what: str, method, request, timeout: float):
        try:
            return method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise _translate(err, self.target, what, self.tls) from None

    def close(self) -> None:
        with self._data_lock:
            if self._data is not None:
                self._data.close()
                self._data = None
        self._channel.close()

    def __enter__(self) -> "BoardClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the API -----------------------------------------------------------
    @property
    def info(self) -> board_pb2.BoardInfo:
        """The board's facts, from the version handshake (done once per client)."""
        if self._info is None:
            self._info = self.handshake()
        return self._info

    def handshake(self) -> board_pb2.BoardInfo:
        req = board_pb2.HandshakeRequest(api_version=API_VERSION, client_version=__version__, client_name=self.client_name,
                                         client_arch=platform.machine(), client_onnxruntime_version=onnxruntime_version())
        reply = self._call("handshake", self._stub.Handshake, req, self.deadlines.connect)
        if reply.board.api_version != API_VERSION:
            raise IncompatibleVersion(
                f"board {self.target} runs bpuemu {reply.board.daemon_version} (board API v{reply.board.api_version}); "
                f"this host runs bpuemu {__version__} (API v{API_VERSION})",
                hint="install the same bpuemu major version on host and board",
            )
        return reply.board

    def has_model(self, sha: str) -> board_pb2.HasModelReply:
        self.info
        return self._call("HasModel", self._stub.HasModel, board_pb2.ModelRef(sha256=sha), self.deadlines.call)

    def upload(self, path: str, sha: Optional[str] = None, offset: Optional[int] = None) -> board_pb2.UploadReply:
        """Store the model file on the board, resuming where the board is after each interruption.

        ``offset``: the bytes of it the board holds (HasModel's partial_bytes); None asks the board. An attempt
        cut short (the link broke or went silent for Deadlines.upload_stall, a deadline passed) is followed by
        another that sends only the bytes the board does not hold, at most Deadlines.upload_attempts in all.
        ``self.last_upload`` tells what it took (UploadTally).
        """
        sha = sha or file_sha256(path)
        size = os.path.getsize(path)
        what = f"upload of {os.path.basename(path)}"
        tally = self.last_upload = UploadTally(size=size)
        if offset is None:
            held = self.has_model(sha)
            if held.present:
                return board_pb2.UploadReply(sha256=sha, already_present=True)
            offset = held.partial_bytes
        error: Optional[BpuEmuError] = None
        for _ in range(max(1, self.deadlines.upload_attempts)):
            tally.attempts += 1
            tally.offsets.append(offset)
            reply, error = self._upload_attempt(path, sha, size, offset, tally, what)
            if reply is not None and not reply.offset_mismatch:
                return reply
            held = self._held_after(sha, what) if reply is None else reply.held_bytes
            if held is None:
                return board_pb2.UploadReply(sha256=sha, already_present=True)
            if reply is None:
                tally.lost_bytes += max(0, tally.last_end - held)
            offset = held
        raise error or BoardUnavailable(f"board {self.target}: {what} did not finish in {tally.attempts} attempts",
                                        hint="the link to the board keeps breaking")

    def _upload_attempt(self, path: str, sha: str, size: int, offset: int, tally: "UploadTally", what: str):
        """One UploadModel call from ``offset``: (reply, None), or (None, the error) when it was cut short in a way a
        resumed attempt may get past. Other errors raise."""
        last_pull = [time.monotonic()]
        tally.last_end = offset

        def chunks() -> Iterator[board_pb2.UploadChunk]:
            yield board_pb2.UploadChunk(header=board_pb2.UploadHeader(
                sha256=sha, size=size, file_name=os.path.basename(path), offset=offset, resumable=True))
            with open(path, "rb") as f:
                f.seek(offset)
                for block in iter(lambda: f.read(UPLOAD_CHUNK_BYTES), b""):
                    last_pull[0] = time.monotonic()
                    tally.sent_bytes += len(block)
                    tally.last_end += len(block)
                    yield board_pb2.UploadChunk(data=block)
            last_pull[0] = float("inf")  # all sent: the board now checks and stores it

        timeout = self.deadlines.upload_base + (size - offset) / self.deadlines.upload_bytes_per_s
        call = self._stub.UploadModel.future(chunks(), timeout=timeout, metadata=self._metadata)
        stalled = False
        while True:
            try:
                return call.result(timeout=0.2), None
            except grpc.FutureTimeoutError:
                if time.monotonic() - last_pull[0] > self.deadlines.upload_stall:
                    stalled = True
                    call.cancel()  # the board keeps what it received; the next attempt resumes there
            except grpc.FutureCancelledError:
                return None, BoardUnavailable(
                    f"board {self.target}: {what} stalled: no chunk taken for {self.deadlines.upload_stall:g} s",
                    hint="the link to the board went silent")
            except grpc.RpcError as err:
                translated = _translate(err, self.target, what, self.tls)
                if stalled or err.code() in _RESUMABLE_UPLOAD_CODES:
                    return None, translated
                raise translated from None

    def _held_after(self, sha: str, what: str) -> Optional[int]:
        """After a cut attempt: the bytes the board holds (None: it has the whole model, from another upload).
        The link may still be down: asked until the upload's stall deadline passes again."""
        deadline = time.monotonic() + max(self.deadlines.call, self.deadlines.upload_stall)
        while True:
            try:
                held = self._call(f"{what} (resuming)", self._stub.HasModel, board_pb2.ModelRef(sha256=sha),
                                  max(1.0, deadline - time.monotonic()))
                return None if held.present else held.partial_bytes
            except (BoardUnavailable, DeadlineExceeded):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    def ensure_model(self, path: str) -> str:
        """Make sure the board stores the model file; returns its id (SHA-256)."""
        if not os.path.isfile(path):
            raise NotFound(f"model file not found: {path}")
        sha = file_sha256(path)
        held = self.has_model(sha)
        if not held.present:
            self.upload(path, sha, offset=held.partial_bytes)
        return sha

    def load(self, sha: str) -> List[str]:
        return list(self._call("LoadModel", self._stub.LoadModel, board_pb2.ModelRef(sha256=sha), self.deadlines.infer).model_names)

    def unload(self, sha: str) -> bool:
        return self._call("UnloadModel", self._stub.UnloadModel, board_pb2.ModelRef(sha256=sha), self.deadlines.call).was_loaded

    def list_models(self) -> List[board_pb2.StoredModel]:
        return list(self._call("ListModels", self._stub.ListModels, board_pb2.ListModelsRequest(), self.deadlines.call).models)

    def model_info(self, sha: str, model_name: str = "") -> model_pb2.Model:
        req = board_pb2.ModelInfoRequest(sha256=sha, model_name=model_name)
        return self._call("GetModelInfo", self._stub.GetModelInfo, req, self.deadlines.infer).model

    def infer(self, sha: str, model_name: str, inputs: Sequence[np.ndarray], input_names: Sequence[str] = (),
              dump_intermediate: bool = False, frame_count: int = 1, core_id: int = 0) -> InferResult:
        args = (sha, model_name, inputs, input_names, dump_intermediate, frame_count, core_id)
        timeout = self.deadlines.infer * max(1, frame_count)
        result = self._infer_data_channel(args, timeout)
        if result is None:
            result = infer_result(self._call("infer", self._stub.Infer, infer_request(*args), timeout))
        return result

    def _infer_data_channel(self, args: tuple, timeout: float) -> Optional[InferResult]:
        """Infer over the data channel; None when it is not available (the caller uses gRPC)."""
        if not self._use_data or not self.info.data_port:
            return None
        if not self._data_lock.acquire(blocking=False):
            return None
        try:
            if self._data is None:
                try:
                    self._data = _DataChannel(self._host, self.info.data_port, self._token, self.tls,
                                              self._keep_cpu)
                except (OSError, ValueError):
                    self._use_data = False  # firewalled, forwarded, or refused: gRPC from now on
                    return None
            try:
                reply, error = self._data.infer(args, timeout)
            except socket.timeout:
                self._data.close()
                self._data = None
                raise DeadlineExceeded(f"board {self.target} did not answer infer within {timeout:.0f} s",
                                       hint="the board may be overloaded or the job too long") from None
            except (OSError, ValueError) as exc:
                self._data.close()
                self._data = None
                raise BoardUnavailable(f"board {self.target} went away during infer: {exc}",
                                       hint="is hrt_boardd still running there?") from None
            if error is not None:
                status, message = error
                cls = BY_GRPC_STATUS.get(status, InternalError)
                text, _, hint = message.partition("\nHint: ")
                raise cls(f"board {self.target}: {text}", hint=hint)
            return reply
        finally:
            self._data_lock.release()

    def stats(self) -> board_pb2.BoardStats:
        """The board's counters and memory now (GetStats)."""
        return self._call("GetStats", self._stub.GetStats, board_pb2.StatsRequest(), self.deadlines.call)

    def perf(self, sha: str, model_name: str, config: PerfConfig, inputs: Sequence[np.ndarray] = (),
             progress: Optional[Callable[[int, int, float], None]] = None, timeout: Optional[float] = None,
             cancel: Optional[threading.Event] = None) -> PerfReport:
        """Run a perf job on the board; ``progress`` gets (done, total, elapsed_s) as it streams.

        Setting ``cancel`` (from any thread) cancels the call: the board stops the
        job within one progress interval and this raises Cancelled.
        """
        req = board_pb2.PerfRequest(sha256=sha, model_name=model_name, frame_count=config.frame_count,
                                    perf_time_minutes=config.perf_time_minutes, thread_num=config.thread_num,
                                    core_id=config.core_id, profile=config.profile)
        req.inputs.extend(to_wire(f"input_{i}", a) for i, a in enumerate(inputs))
        if timeout is None:
            if config.perf_time_minutes > 0:
                timeout = config.perf_time_minutes * 60 + self.deadlines.perf_margin
            else:
                timeout = self.deadlines.perf_margin + config.frame_count * self.deadlines.perf_frame_budget_s / config.thread_num
        stream = self._stub.Perf(req, timeout=timeout, metadata=self._metadata)
        finished = threading.Event()
        if cancel is not None:
            def watch():
                while not finished.is_set():
                    if cancel.wait(0.05):
                        stream.cancel()
                        return

            threading.Thread(target=watch, name="perf-cancel", daemon=True).start()
        try:
            for event in stream:
                if event.WhichOneof("event") == "progress":
                    if progress is not None:
                        p = event.progress
                        progress(p.frames_done, p.frames_total, p.elapsed_s)
                else:
                    return perf_report_from_proto(event.result)
        except grpc.RpcError as err:
            if cancel is not None and cancel.is_set() and err.code() == grpc.StatusCode.CANCELLED:
                raise Cancelled(f"perf on {self.target} was cancelled by the caller") from None
            raise _translate(err, self.target, "perf", self.tls) from None
        finally:
            finished.set()
        raise BoardUnavailable(f"board {self.target} ended the perf stream without a result",
                               hint="the daemon may have been restarted; check its log")
