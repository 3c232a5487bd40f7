"""Constants of the board protocol that both ends must agree on.

The messages themselves are defined in proto/bpuemu/board/v1/board.proto.
"""
import ipaddress
import socket
import ssl
import sys
import threading
import time
from typing import Optional

#: Port hrt_boardd listens on when --listen gives none, and clients assume.
DEFAULT_PORT = 9473

#: Upload chunk size: streaming in 1 MiB chunks measured ~2.5x faster than
#: one large unary message on this class of machine (DESIGN.md).
UPLOAD_CHUNK_BYTES = 1 << 20

#: Largest single message either side accepts (an infer request or reply
#: carrying tensors). Larger requests fail with RESOURCE_EXHAUSTED.
MAX_MESSAGE_BYTES = 256 << 20

#: Metadata key carrying the caller's token (see hrt_boardd --token-file).
TOKEN_METADATA_KEY = "authorization"

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]


def split_target(target: str, default_port: int = DEFAULT_PORT) -> tuple:
    """'host[:port]' -> (host, port); IPv6 literals go in brackets: [::1]:9473."""
    target = target.strip()
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif target.count(":") == 1:
        host, port = target.split(":")
    else:
        host, port = target, ""
    if not host:
        raise ValueError(f"'{target}' names no host")
    if port and not port.isdigit():
        raise ValueError(f"'{target}': port '{port}' is not a number")
    if port and int(port) > 65535:
        raise ValueError(f"'{target}': port {port} is out of range (0-65535)")
    return host, int(port) if port else default_port


def join_target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback_address(address: str) -> bool:
    """Whether an IP address (a socket's peer, "127.0.0.1", "::1", "fe80::1%lo") is a loopback one."""
    try:
        return ipaddress.ip_address(address.partition("%")[0]).is_loopback
    except ValueError:
        return False


def is_loopback_host(host: str) -> bool:
    """Whether a host to listen on or connect to reaches this machine only: "localhost", a loopback
    address, or a name every address of which is a loopback one (False when it does not resolve)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.partition("%")[0]).is_loopback
    except ValueError:
        pass  # a name: resolve it
    try:
        return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
    except OSError:
        return False


# --- the infer data channel ----------------------------------------------
#
# gRPC's per-call cost from Python (~0.5 ms on loopback) dominates a frame's
# transfer, so hrt_boardd also serves infer on a TCP port of its own (BoardInfo.
# data_port; TLS, with the same certificates, when the daemon serves TLS)
# carrying the proto's own InferRequest / InferReply bytes:
#
#   frame   = header payload
#   header  = magic "BPUD" (4 bytes) | kind (uint8) | payload length (uint32 LE)
#   kinds   = HELLO (client -> board, payload: the token, UTF-8, may be empty)
#             HELLO_OK (board -> client, empty)
#             INFER (client -> board, a serialized InferRequest)
#             REPLY (board -> client, a serialized InferReply)
#             ERROR (board -> client, "<gRPC status name>\n<message>")
#
# One request at a time per connection; an ERROR keeps the connection open.
# A bad HELLO, a wrong magic or an oversize frame closes it; so does a board
# with all its data connections taken (an ERROR "RESOURCE_EXHAUSTED" first).

import struct as _struct

DATA_MAGIC = b"BPUD"
DATA_HEADER = _struct.Struct("<4sBI")
HELLO, HELLO_OK, INFER, REPLY, ERROR = 1, 2, 3, 4, 5


def pack_frame(kind: int, payload: bytes = b"") -> bytes:
    return DATA_HEADER.pack(DATA_MAGIC, kind, len(payload)) + payload


def read_exact(sock, n: int, deadline: Optional[float] = None) -> bytearray:
    """Read exactly n bytes, or raise ConnectionError when the peer closes.

    ``deadline`` (a time.monotonic() value): raise socket.timeout once it has
    passed, however the bytes trickle in (a socket timeout alone bounds each
    recv, not the whole read). Returns the bytearray it read into (protobuf
    parses it without a copy).
    """
    buf = bytearray(n)
    read_into(sock, memoryview(buf), deadline)
    return buf


def read_into(sock, view: memoryview, deadline: Optional[float] = None) -> None:
    """Fill ``view`` from ``sock`` (a buffer the caller reuses); as read_exact otherwise."""
    n = len(view)
    got = 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("deadline passed mid-frame")
            sock.settimeout(remaining)
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError("connection closed mid-frame" if got else "connection closed")
        got += k


def send_all(sock, data: bytes, deadline: float) -> None:
    """Send all of ``data`` by ``deadline`` (a time.monotonic() value), or raise socket.timeout.

    Unlike a socket timeout, which a TLS socket applies to each send, the
    deadline holds for the whole of it, however slowly the peer reads.
    """
    view = memoryview(data)
    sent = 0
    while sent < len(view):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("deadline passed mid-send")
        sock.settimeout(remaining)
        sent += sock.send(view[sent:])


#: Buffers one sendmsg takes at most (Linux allows 1024).
_MAX_IOV = 512


def frame_parts(kind: int, parts: list) -> list:
    """A frame whose payload is the concatenation of ``parts`` (bytes or memoryviews), as buffers."""
    return [DATA_HEADER.pack(DATA_MAGIC, kind, sum(memoryview(p).nbytes for p in parts)), *parts]


def send_parts(sock, parts: list, deadline: float) -> None:
    """Send the concatenation of ``parts`` by ``deadline`` as send_all does, without joining them:
    sendmsg hands every buffer to the kernel at once. A TLS socket has no sendmsg: joined there."""
    if isinstance(sock, ssl.SSLSocket):
        send_all(sock, b"".join(parts), deadline)
        return
    _send_rest(sock, parts, 0, deadline, None)


def _send_rest(sock, parts: list, sent: int, deadline: float, clock: Optional["KernelClock"]) -> None:
    """Send what follows the first ``sent`` bytes of ``parts`` by ``deadline``; ``clock``: the socket's kernel
    clock for its sends (None: Python's socket timeout)."""
    views = [v for v in (memoryview(p).cast("B") for p in parts) if len(v)]
    while True:
        while sent:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0
        if not views:
            return
        if clock is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("deadline passed mid-send")
            sock.settimeout(remaining)
        else:
            clock.arm(deadline)
        try:
            sent = sock.sendmsg(views[:_MAX_IOV])
        except BlockingIOError:  # a kernel clock's timeout ran out with nothing sent
            clock.expired(deadline)


#: Seconds a read or a send may run past its deadline when the kernel keeps it (KernelClock).
KERNEL_SLACK_S = 0.25
_TIMEVAL = _struct.Struct("@ll")  # struct timeval: seconds, microseconds (Linux)


class KernelClock:
    """One direction's deadlines on a plain socket in blocking mode, kept by the kernel (SO_RCVTIMEO for its
    reads or SO_SNDTIMEO for its sends): each recv or sendmsg is one system call, where a Python socket timeout
    makes it three (settimeout's ioctl, a poll, the call itself).

    The kernel's timeout bounds each call; the deadline, checked when it runs out, bounds them all (a
    trickling peer gets no more time than with settimeout). It is set again only when it would end more
    than KERNEL_SLACK_S past the deadline, so a stream of calls with deadlines of one length sets it once.
    """

    __slots__ = ("sock", "option", "armed")

    def __init__(self, sock, option: int):
        self.sock, self.option = sock, option
        self.armed = 0.0  # the kernel's timeout now, seconds (0: none)

    @classmethod
    def of(cls, sock, option: str) -> Optional["KernelClock"]:
        """A clock for ``sock`` (switched to blocking mode), or None for a socket that keeps Python's timeouts:
        TLS (its reads and writes are the ssl module's), or a system other than Linux."""
        if type(sock) is not socket.socket or not _KERNEL_TIMEOUTS:
            return None
        sock.settimeout(None)
        return cls(sock, getattr(socket, option))

    def arm(self, deadline: Optional[float]) -> None:
        """Before a call: its kernel timeout ends by ``deadline`` (a time.monotonic() value; None: never)."""
        if deadline is None:
            if self.armed:
                self._set(0.0)
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("deadline passed")
        if not self.armed or self.armed > remaining + KERNEL_SLACK_S:
            self._set(remaining)

    def expired(self, deadline: Optional[float]) -> None:
        """After a call ran out of the kernel's time (EAGAIN): raise socket.timeout once ``deadline`` has
        passed, else give the kernel what remains of it."""
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise socket.timeout("deadline passed")
        self._set(remaining or 0.0)

    def read_into(self, view: memoryview, deadline: Optional[float]) -> None:
        """read_into, with this clock."""
        got, n = 0, len(view)
        while got < n:
            self.arm(deadline)
            try:
                k = self.sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
            except BlockingIOError:
                self.expired(deadline)
                continue
            if not k:
                raise ConnectionError("connection closed mid-frame" if got else "connection closed")
            got += k

    def _set(self, seconds: float) -> None:
        whole = int(seconds)
        micro = int((seconds - whole) * 1e6)
        if seconds and not whole and not micro:
            micro = 1  # 0 would be no timeout at all
        self.sock.setsockopt(socket.SOL_SOCKET, self.option, _TIMEVAL.pack(whole, micro))
        self.armed = seconds


_KERNEL_TIMEOUTS = sys.platform.startswith("linux") and hasattr(socket, "SO_RCVTIMEO")


class FrameWriter:
    """Sends the frames of one connection (each a list of buffers, as send_parts), by a deadline.

    On a plain socket of this system a frame is usually one sendmsg: the deadline is kept by the kernel
    (KernelClock) and the frame's size read from its header. Otherwise, and when the peer's buffer is full,
    as send_parts.
    """

    def __init__(self, sock):
        self.sock = sock
        self._clock = KernelClock.of(sock, "SO_SNDTIMEO")

    def send(self, parts: list, deadline: float) -> None:
        """Send the frame ``parts`` (the first begins with the frame's header) by ``deadline``."""
        clock = self._clock
        if clock is None:
            send_parts(self.sock, parts, deadline)
            return
        if len(parts) > _MAX_IOV:
            _send_rest(self.sock, parts, 0, deadline, clock)
            return
        clock.arm(deadline)
        try:
            sent = self.sock.sendmsg(parts)
        except BlockingIOError:
            sent = 0
        if sent < DATA_HEADER.size + DATA_HEADER.unpack_from(parts[0])[2]:  # the kernel's timeout ran out first
            _send_rest(self.sock, parts, sent, deadline, clock)


#: A frame over the reader's kept buffer is read into a buffer that grows as its bytes come, by this at least.
GROW_BYTES = 64 << 10


class BudgetExhausted(ValueError):
    """A frame's bytes would pass what all connections' frames may hold at once (ByteBudget)."""


class ByteBudget:
    """Bytes that the frames of all connections may hold at once: each large frame takes its share as its bytes
    come, and gives it back once done with."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            if self.held + n > self.limit:
                raise BudgetExhausted(f"frames of all connections already hold {self.held} of {self.limit} bytes")
            self.held += n

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n


class FrameReader:
    """The frames of one connection, read into a buffer it keeps with as few recv calls as the bytes allow.

    Each recv takes whatever has arrived, up to the buffer's room, so a frame that has
    come whole (the usual reply, a request's first segment) costs one poll and one recv
    with its header, not two of each, and one socket timeout set per read, not per recv
    (each settimeout is a system call). Bytes past a frame stay for the next read.

    ``payload`` returns a view of the kept buffer, valid until the next read of this
    reader, for frames of up to ``keep_bytes``; a larger frame gets a buffer of its own,
    which its caller may keep (views of it live on), grown as its bytes come. The kept
    buffer grows to the largest frame it holds. With a ``budget`` (ByteBudget) both
    take their memory from it (BudgetExhausted when it is spent): the kept buffer's
    growth until ``close``, a large frame's until ``release``.

    On a plain socket of this system (not TLS) the deadlines are kept by the kernel
    (KernelClock): the socket is put in blocking mode and each read is one recv.
    """

    def __init__(self, sock, keep_bytes: int, size: int = 1 << 16, budget: Optional[ByteBudget] = None):
        self.sock = sock
        self.keep_bytes = keep_bytes
        self.budget = budget  # what frames over keep_bytes take their memory from (None: no bound in total)
        self.held = 0  # bytes of the budget the last large frame holds
        self.kept_held = 0  # bytes of the budget the kept buffer's growth holds (until close)
        self._clock = KernelClock.of(sock, "SO_RCVTIMEO")
        self._buf = bytearray(size)
        self._view = memoryview(self._buf)
        self._start = self._end = 0  # the unread bytes: self._buf[self._start:self._end]
        self._payload, self._payload_at = None, 0  # the last payload's view of the kept buffer, and where

    def header(self, deadline: Optional[float] = None) -> tuple:
        """(kind, payload length) of the next frame; raises ValueError on a wrong magic."""
        self._fill(DATA_HEADER.size, deadline)
        magic, kind, length = DATA_HEADER.unpack_from(self._buf, self._start)
        if magic != DATA_MAGIC:
            raise ValueError(f"bad frame magic {magic!r}")
        self._start += DATA_HEADER.size
        return kind, length

    def payload(self, length: int, deadline: Optional[float] = None) -> memoryview:
        """The next ``length`` bytes (the payload whose header was just read)."""
        if length > self.keep_bytes:
            return self._payload_as_it_comes(length, deadline)
        self._fill(length, deadline)
        start = self._start
        self._start += length
        view = self._payload
        if view is None or start != self._payload_at or length != len(view):
            # A new place: a view made for it. A stream of calls of one size reads each into the same place
            # (the buffer's front) and gets the same view object (a parser may keep what it made of it).
            view = self._payload = self._view[start:start + length]
            self._payload_at = start
        return view

    def _payload_as_it_comes(self, length: int, deadline: Optional[float]) -> memoryview:
        """A frame over keep_bytes, in a buffer of its own that grows (doubling, by GROW_BYTES at least) as its
        bytes come: a header announcing a large frame costs nothing until its bytes do. Each growth is taken
        from the budget (BudgetExhausted when it has not enough) and held until ``release``."""
        self.release()
        take = min(self._end - self._start, length)
        own = bytearray(self._view[self._start:self._start + take])
        self._start += take
        self._hold(take)
        while len(own) < length:
            got = len(own)
            room = min(length, max(2 * got, GROW_BYTES)) - got
            self._hold(room)
            own.extend(bytes(room))  # calloc'd zeros: pages become resident as the bytes are written
            with memoryview(own) as view:
                part = view[got:]
                try:
                    if self._clock is None:
                        read_into(self.sock, part, deadline)
                    else:
                        self._clock.read_into(part, deadline)
                finally:
                    part.release()
        return memoryview(own)

    def _hold(self, n: int) -> None:
        if self.budget is not None and n:
            self.budget.take(n)
            self.held += n

    def release(self) -> None:
        """Give back to the budget what the last large frame held (its caller is done with it)."""
        if self.held:
            self.budget.give(self.held)
            self.held = 0

    def _hold_kept(self, n: int) -> None:
        if self.budget is not None and n > 0:
            self.budget.take(n)
            self.kept_held += n

    def close(self) -> None:
        """Give back all this reader holds of the budget (its connection is done)."""
        self.release()
        if self.kept_held:
            self.budget.give(self.kept_held)
            self.kept_held = 0

    def frame(self, deadline: Optional[float] = None, max_bytes: int = MAX_MESSAGE_BYTES) -> tuple:
        """(kind, payload) of the next frame, as read_frame."""
        kind, length = self.header(deadline)
        if length > max_bytes:
            raise ValueError(f"frame of {length} bytes is over the {max_bytes}-byte limit")
        return kind, self.payload(length, deadline)

    def _fill(self, n: int, deadline: Optional[float]) -> None:
        """At least ``n`` unread bytes in the buffer, by ``deadline``."""
        have = self._end - self._start
        if have >= n:
            return
        if not have:  # all read: the next frame starts at the front
            self._start = self._end = 0
        if self._start + n > len(self._buf):  # make room: the unread bytes to the front, of a larger buffer if need be
            unread = bytes(self._view[self._start:self._end])
            if DATA_HEADER.size + n > len(self._buf):  # room for the next such frame, header and all, from the front
                size = max(DATA_HEADER.size + n, 2 * len(self._buf))
                self._hold_kept(size - len(self._buf))
                self._buf = bytearray(size)
                self._view = memoryview(self._buf)
                self._payload = None
            self._buf[:have] = unread
            self._start, self._end = 0, have
        clock, wait = self._clock, 0
        while self._end - self._start < n:
            if clock is None:
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise socket.timeout("deadline passed mid-frame")
                    self.sock.settimeout(remaining)
                k = self.sock.recv_into(self._view[self._end:])
            else:  # what has come, and once that falls short, the rest in one call
                clock.arm(deadline)
                try:
                    k = self.sock.recv_into(self._view[self._end:], wait, socket.MSG_WAITALL if wait else 0)
                except BlockingIOError:  # the kernel's timeout ran out
                    clock.expired(deadline)
                    continue
                wait = n - (self._end + k - self._start)
            if not k:
                raise ConnectionError("connection closed mid-frame" if self._end > self._start else "connection closed")
            self._end += k


def read_frame(sock, max_bytes: int = MAX_MESSAGE_BYTES, deadline: Optional[float] = None) -> tuple:
    """(kind, payload) of the next frame; ``deadline`` as for read_exact."""
    magic, kind, length = DATA_HEADER.unpack(bytes(read_exact(sock, DATA_HEADER.size, deadline)))
    if magic != DATA_MAGIC:
        raise ValueError(f"bad frame magic {magic!r}")
    if length > max_bytes:
        raise ValueError(f"frame of {length} bytes is over the {max_bytes}-byte limit")
    return kind, read_exact(sock, length, deadline) if length else b""


# --- bounded parsing ------------------------------------------------------
#
# A message's wire size does not bound what its parse takes: a packed repeated
# int64 keeps 8 bytes for each 1-byte varint, and an empty sub-message of 2
# bytes becomes an object of dozens. ``parse_bounded`` walks the wire format
# (by the message's descriptor; bytes and strings are skipped by their length,
# packed varints counted in C) and refuses a message whose parse would take more
# than ``GROWTH_FACTOR`` times its size plus ``GROWTH_SLACK_BYTES``, before
# protobuf allocates anything for it.

#: What parsing a message may take, at most, in bytes: GROWTH_FACTOR x its size + GROWTH_SLACK_BYTES.
GROWTH_FACTOR = 2
GROWTH_SLACK_BYTES = 1 << 20
#: What one element costs a parse, by its kind (estimates of protobuf's in-memory sizes, rounded up).
_MESSAGE_COST, _SCALAR_COST, _STRING_COST = 64, 8, 32
#: The most a wire byte can cost (an empty sub-message: 2 bytes): a message this many times smaller than its
#: bound needs no walk.
_WORST_COST_PER_BYTE = _MESSAGE_COST // 2
_HIGH_BYTES = bytes(range(0x80, 0x100))


class MessageTooLarge(ValueError):
    """A message whose parse would take more memory than its size allows."""


def _varint(data, pos: int) -> tuple:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise MessageTooLarge("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise MessageTooLarge("varint over 64 bits")


def _varint_count(span, most: float) -> int:
    """The varints in ``span`` (bytes below 0x80 end one), counted a MiB at a time up to just past ``most``."""
    count = 0
    for start in range(0, len(span), 1 << 20):
        count += len(bytes(span[start:start + (1 << 20)]).translate(None, _HIGH_BYTES))
        if count > most:
            break
    return count


def parse_cost(descriptor, data, budget: float) -> float:
    """What parsing ``data`` as the message ``descriptor`` would take (an estimate, in bytes); MessageTooLarge
    once it passes ``budget``, or for bytes that are not a message."""
    from google.protobuf.descriptor import FieldDescriptor as F

    cost, pos, end = _MESSAGE_COST, 0, len(data)
    fields = descriptor.fields_by_number
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        field = fields.get(number)
        if wire == 0:
            _, pos = _varint(data, pos)
            cost += _SCALAR_COST
        elif wire == 1 or wire == 5:
            pos += 8 if wire == 1 else 4
            cost += _SCALAR_COST
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > end:
                raise MessageTooLarge("truncated length-delimited field")
            span = data[pos:pos + length]
            pos += length
            if field is not None and field.type == F.TYPE_MESSAGE:
                cost += parse_cost(field.message_type, span, budget - cost)
            elif field is not None and field.type not in (F.TYPE_STRING, F.TYPE_BYTES):  # a packed repeated scalar
                per = 4 if field.type in (F.TYPE_FLOAT, F.TYPE_FIXED32, F.TYPE_SFIXED32) else 8
                count = length // per if field.type in (F.TYPE_FLOAT, F.TYPE_FIXED32, F.TYPE_SFIXED32, F.TYPE_DOUBLE,
                                                        F.TYPE_FIXED64, F.TYPE_SFIXED64) \
                    else _varint_count(span, (budget - cost) / 8)
                cost += count * 8
            else:
                cost += _STRING_COST + length
        else:  # groups (3, 4) and reserved wire types: not in any message of this project
            raise MessageTooLarge(f"unsupported wire type {wire}")
        if cost > budget:
            raise MessageTooLarge(f"parsing it would take over {int(budget)} bytes")
    return cost


def check_parse_bound(message_class, data) -> None:
    """MessageTooLarge when parsing ``data`` as ``message_class`` would take more than GROWTH_FACTOR x its size
    + GROWTH_SLACK_BYTES (a message too small to get there is not walked)."""
    view = memoryview(data)
    budget = GROWTH_FACTOR * len(view) + GROWTH_SLACK_BYTES
    if _WORST_COST_PER_BYTE * len(view) + _MESSAGE_COST > budget:
        parse_cost(message_class.DESCRIPTOR, view, budget)


def parse_bounded(message_class, data: bytes):
    """``message_class.FromString(data)``, refused (MessageTooLarge) when its parse would take more than
    GROWTH_FACTOR x len(data) + GROWTH_SLACK_BYTES."""
    check_parse_bound(message_class, data)
    return message_class.FromString(data)
