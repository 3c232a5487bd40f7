"""The attacks of issue 34 on a real hrt_boardd, as functions a test (tests/board/test_attacks.py) and a
benchmark (bench/attacks.py) share, and the daemon's peak memory under each.

Each attack takes a started ``Daemon`` (tests/board/boardd_harness.py) and returns what it saw; ``PeakMemory``
resets the daemon's peak resident memory (``/proc/PID/clear_refs``, 5) before an attack and reads it after
(``VmHWM``), so each attack's peak is its own.
"""
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

import grpc
import numpy as np

from bpuemu.common.container import read_bin, sha256_hex, write_bin
from bpuemu.common.wire import DATA_HEADER, DATA_MAGIC, HELLO, HELLO_OK, INFER, TOKEN_METADATA_KEY, pack_frame, read_frame

MIB = 1 << 20
INFER_PATH = "/bpuemu.board.v1.Board/Infer"
STATS_PATH = "/bpuemu.board.v1.Board/GetStats"
WATCH_PATH = "/grpc.health.v1.Health/Watch"


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


class PeakMemory:
    """The daemon's peak resident memory over a block, above its resident memory at the start (bytes)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.start = self.peak = 0

    def __enter__(self):
        with open(f"/proc/{self.pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current VmRSS
        self.start = _status_kb(self.pid, "VmRSS") * 1024
        return self

    def __exit__(self, *exc):
        self.peak = _status_kb(self.pid, "VmHWM") * 1024

    @property
    def growth(self) -> int:
        return max(0, self.peak - self.start)


# --- 1. a model that reads the board's files -----------------------------------------------------

def external_data_bin(src: str, dst: str, location: str = "secret.txt", nested: bool = False) -> str:
    """A copy of the `.bin` ``src`` whose first piece keeps its largest initializer as ONNX external data
    at ``location`` (``nested``: in a Constant inside an If's branch instead); returns the tensor's name."""
    import onnx
    from onnx import helper

    binfile = read_bin(src)
    name = sorted(binfile.blobs)[0]
    piece = onnx.load_from_string(binfile.blobs[name])
    w = max(piece.graph.initializer, key=lambda t: len(t.raw_data) or t.ByteSize())
    if nested:
        t = onnx.TensorProto()
        t.CopyFrom(w)
        t.name = "stolen"
        w = t
    size = len(w.raw_data)
    w.ClearField("raw_data")
    w.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(size))):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    if nested:  # an unused If whose branch holds the external tensor: the check must look into subgraphs
        branch = helper.make_graph([helper.make_node("Constant", [], ["c"], value=w)], "then", [],
                                   [helper.make_tensor_value_info("c", w.data_type, list(w.dims))])
        cond = helper.make_tensor("always", onnx.TensorProto.BOOL, [], [True])
        piece.graph.initializer.append(cond)
        piece.graph.node.append(helper.make_node("If", ["always"], ["stolen_out"], then_branch=branch,
                                                 else_branch=branch, name="if_steal"))
    blobs = dict(binfile.blobs)
    blobs[name] = piece.SerializeToString()
    write_bin(dst, list(binfile.manifest.models), blobs)
    return w.name


# --- 2. requests refused only after they are parsed --------------------------------------------------

def varint_bomb(count: int) -> bytes:
    """An encoded InferRequest of about ``count`` bytes whose one tensor's shape is ``count`` packed varints
    (1 byte each on the wire, 8 bytes each parsed)."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            b = n & 0x7F
            n >>= 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)

    shape = b"\x1a" + varint(count) + b"\x01" * count  # Tensor.shape = 3, packed
    return b"\x1a" + varint(len(shape)) + shape  # InferRequest.inputs = 3


def raw_infer(channel: grpc.Channel, payload: bytes, token: Optional[str], timeout: float = 60.0):
    """Send ``payload`` as an Infer request's bytes; the grpc.StatusCode it ends with."""
    call = channel.unary_unary(INFER_PATH, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    metadata = ((TOKEN_METADATA_KEY, f"Bearer {token}"),) if token else ()
    try:
        call(payload, timeout=timeout, metadata=metadata)
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()


# --- 3. a worker pool that idle calls freeze -------------------------------------------------------

def own_channel(target: str) -> grpc.Channel:
    """A channel with a connection of its own (gRPC would otherwise share one between channels)."""
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


class StalledCalls:
    """``count`` calls of a unary method that never send their request, spread over ``connections``
    connections (each its own channel), and ``watches`` Health.Watch streams left open."""

    def __init__(self, target: str, count: int, connections: int = 1, token: Optional[str] = None,
                 watches: int = 0, path: str = STATS_PATH):
        self.channels = [own_channel(target) for _ in range(connections)]
        self.release = threading.Event()
        metadata = ((TOKEN_METADATA_KEY, f"Bearer {token}"),) if token else ()

        def never():
            self.release.wait()
            return
            yield  # pragma: no cover

        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self.channels[0])
        self.watches = [stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=120) for _ in range(watches)]
        for w in self.watches:
            next(w)  # the watch's first status: it is open
        self.calls = []
        for i in range(count):
            stalled = self.channels[i % connections].stream_unary(path, request_serializer=lambda b: b,
                                                                   response_deserializer=lambda b: b)
            self.calls.append(stalled.future(never(), timeout=120, metadata=metadata))

    def ended(self) -> List[grpc.StatusCode]:
        return [c.exception().code() for c in self.calls if c.done() and c.exception() is not None]

    def close(self) -> None:
        self.release.set()
        for c in self.calls:
            c.cancel()
        for w in self.watches:
            w.cancel()
        for ch in self.channels:
            ch.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def timed(fn: Callable):
    """(what ``fn()`` returned or the grpc.StatusCode it raised, seconds it took)."""
    started = time.monotonic()
    try:
        result = fn()
    except grpc.RpcError as err:
        result = err.code()
    return result, time.monotonic() - started


# --- 4. the data channel allocating before the bytes arrive -------------------------------------------

def data_hello(port: int, token: str, timeout: float = 10) -> socket.socket:
    """A data channel connection past HELLO (AssertionError when the board refuses it)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(pack_frame(HELLO, token.encode()))
    kind, payload = read_frame(sock)
    assert kind == HELLO_OK, bytes(payload)
    return sock


def announce_infer(sock: socket.socket, size: int, send: int = 0, chunk: int = MIB) -> None:
    """An INFER header announcing ``size`` bytes, then ``send`` of them (zeros)."""
    sock.sendall(DATA_HEADER.pack(DATA_MAGIC, INFER, size))
    zeros = bytes(chunk)
    sent = 0
    while sent < send:
        n = min(chunk, send - sent)
        sock.sendall(zeros[:n])
        sent += n


@dataclass
class Honest:
    """An honest client's view: did its calls succeed?"""

    served: int = 0
    failed: int = 0
    errors: tuple = ()


def honest_infers(daemon, model, token: Optional[str], rounds: int = 3, **client_kwargs) -> Honest:
    """``rounds`` infers of ``model`` by a fresh BoardClient, each compared with the local runtime."""
    from bpuemu.board.backends import LocalBackend

    with LocalBackend([model.path]) as local:
        expected = local.model().infer([model.x]).outputs
    seen = Honest()
    errors = []
    with daemon.client(token, **client_kwargs) as board:
        for _ in range(rounds):
            try:
                sha = board.ensure_model(model.path)
                out = board.infer(sha, "", [model.x]).outputs
                assert all(np.array_equal(out[k], expected[k]) for k in expected)
                seen.served += 1
            except Exception as exc:  # counted: the test says which
                seen.failed += 1
                errors.append(f"{type(exc).__name__}: {exc}")
    seen.errors = tuple(errors)
    return seen


def store_variant(src: str, directory, i: int) -> str:
    """A copy of ``src`` under another model name (another SHA-256)."""
    from bpuemu.common.proto import model_pb2

    binfile = read_bin(src)
    model = model_pb2.Model()
    model.CopyFrom(binfile.manifest.models[0])
    model.name = f"variant_{i}"
    path = os.path.join(os.fspath(directory), f"variant_{i}.bin")
    write_bin(path, [model], binfile.blobs)
    return path


def sha_of(path: str) -> str:
    with open(path, "rb") as f:
        return sha256_hex(f.read())
