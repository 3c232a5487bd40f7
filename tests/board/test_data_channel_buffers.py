"""The data channel's tensors without copies: what the client sends as buffers and what the board views in
the received frame are the protobuf messages gRPC carries, byte for byte in meaning, for tensors large
enough to take that path (over messages.ZERO_COPY_BYTES) and small ones alike."""
import socket
import threading
import time

import numpy as np
import pytest

from bpuemu.board.backends import LocalBackend
from bpuemu.board.client import BoardClient
from bpuemu.board.messages import (
    ZERO_COPY_BYTES,
    infer_reply,
    infer_reply_parts,
    infer_request,
    infer_request_parts,
    infer_result_from_buffer,
    request_from_buffer,
    request_inputs,
)
from bpuemu.board.runtime.infer import InferResult
from bpuemu.common.errors import InvalidInput
from bpuemu.common.proto import board_pb2
from bpuemu.common.wire import ERROR, HELLO, HELLO_OK, INFER, REPLY, frame_parts, pack_frame, read_frame, send_parts

BIG = 224  # a 1x224x224x3 input: 150 KB, the size the issue measures


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    from bpuemu.host.samples import sample_bin

    path = str(tmp_path_factory.mktemp("big") / "big.bin")
    sample_bin(path, "rgb", "NHWC", BIG, BIG)
    return path


def _inputs(scale):
    rng = np.random.default_rng(scale)
    return [rng.integers(0, 256, (scale, 40, 50, 3), dtype=np.uint8),  # 6 KB x scale
            np.full((), 3.5, np.float32),                              # 0-d
            rng.random((3, 2)).T,                                       # not C-contiguous
            np.zeros((0, 3), np.int8),                                  # empty
            np.array([True, False])]


def _joined(parts):
    return b"".join(bytes(p) for p in parts)


@pytest.mark.parametrize("scale", [1, 40])
def test_request_buffers_are_the_message_protobuf_encodes(scale):
    inputs = _inputs(scale)
    assert (sum(a.nbytes for a in inputs) >= ZERO_COPY_BYTES) == (scale > 1)
    args = ("ab" * 32, "m", inputs, ("a", "b", "c", "d", "e"), True, 7, 2)
    want = infer_request(*args)
    sent = _joined(infer_request_parts(*args))
    assert board_pb2.InferRequest.FromString(sent) == want  # protobuf reads what the client sends
    for encoded in (sent, want.SerializeToString()):  # and the board reads both encodings
        buf = bytearray(encoded) + bytearray(100)  # a kept buffer is longer than the request in it
        request, got = request_from_buffer(memoryview(buf)[:len(encoded)])
        assert request.sha256 == "ab" * 32 and request.frame_count == 7 and request.dump_intermediate
        assert len(request.inputs) == 0
        for a, b in zip(got, request_inputs(want)):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("scale", [1, 40])
def test_reply_buffers_are_the_message_protobuf_encodes(scale):
    rng = np.random.default_rng(3)
    result = InferResult({"prob": rng.random((scale, 100, 10)).astype(np.float32), "n": np.arange(6).reshape(2, 3)},
                         {"inter": rng.integers(-128, 128, (2, 2), dtype=np.int8)}, [1.5, 2.5])
    want = infer_reply(result)
    sent = _joined(infer_reply_parts(result))
    assert board_pb2.InferReply.FromString(sent) == want
    frame = _joined(frame_parts(REPLY, infer_reply_parts(result)))
    assert frame == pack_frame(REPLY, sent)
    for encoded in (sent, want.SerializeToString()):
        got = infer_result_from_buffer(bytearray(encoded))
        assert got.latency_ms == [1.5, 2.5] and list(got.outputs) == ["prob", "n"] and list(got.intermediates) == ["inter"]
        for name, a in {**result.outputs, **result.intermediates}.items():
            b = got.outputs.get(name, got.intermediates.get(name))
            assert b.dtype == a.dtype and np.array_equal(a, b)


def test_a_tensor_of_no_wire_type_is_one_clear_error():
    with pytest.raises(InvalidInput, match="cannot be sent"):
        infer_request_parts("ab" * 32, "", [np.zeros(ZERO_COPY_BYTES, dtype=object)])


def test_large_inputs_and_outputs_over_the_data_channel_match_grpc_and_the_runtime(board, big_model):
    x = np.random.default_rng(0).integers(0, 256, (1, BIG, BIG, 3), dtype=np.uint8)
    y = np.random.default_rng(1).integers(0, 256, (1, BIG, BIG, 3), dtype=np.uint8)
    assert x.nbytes > ZERO_COPY_BYTES
    local = LocalBackend([big_model]).model()
    with board.client() as fast, BoardClient(board.target, data_channel=False) as slow:
        sha = fast.ensure_model(big_model)
        fast.load(sha)
        for inp in (x, y, x):  # one connection, its kept buffer reused: each call answers its own input
            want = local.infer([inp], dump_intermediate=True)
            got = fast.infer(sha, "", [inp], dump_intermediate=True)
            assert fast._data is not None, "the data channel was not used"
            over_grpc = slow.infer(sha, "", [inp], dump_intermediate=True)
            assert sum(a.nbytes for a in got.intermediates.values()) > ZERO_COPY_BYTES
            for name, a in want.outputs.items():
                assert np.array_equal(got.outputs[name], a) and np.array_equal(over_grpc.outputs[name], a)
            assert sorted(got.intermediates) == sorted(over_grpc.intermediates)
            for name, a in over_grpc.intermediates.items():
                assert np.array_equal(got.intermediates[name], a), name
        with pytest.raises(InvalidInput):  # a small request on the same connection, refused
            fast.infer(sha, "", [x[:, :8]])
        assert np.array_equal(fast.infer(sha, "", [y]).outputs["prob"], local.infer([y]).outputs["prob"])


def test_a_malformed_large_request_is_invalid_argument_and_the_connection_serves_on(board, big_model):
    x = np.random.default_rng(0).integers(0, 256, (1, BIG, BIG, 3), dtype=np.uint8)
    with board.client() as c:
        sha = c.ensure_model(big_model)
        c.load(sha)
        port = c.info.data_port
        want = c.infer(sha, "", [x]).outputs
    good = _joined(infer_request_parts(sha, "", [x]))
    bad = bytearray(good)
    at = len(good) - x.nbytes - 4  # the input's data field (key, 3-byte length): say it is longer than it is
    assert bad[at] == 0x22
    bad[at + 1] = 0xFF
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(pack_frame(HELLO))
        assert read_frame(s)[0] == HELLO_OK
        s.sendall(pack_frame(INFER, bytes(bad)))
        kind, payload = read_frame(s)
        assert kind == ERROR and bytes(payload).startswith(b"INVALID_ARGUMENT\n"), bytes(payload)[:200]
        s.sendall(pack_frame(INFER, good))
        kind, payload = read_frame(s)
        assert kind == REPLY
        got = infer_result_from_buffer(payload).outputs
        assert all(np.array_equal(got[n], a) for n, a in want.items())
    finally:
        s.close()


def test_send_parts_sends_every_byte_in_order_when_the_kernel_takes_them_in_pieces():
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    big = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    parts = [b"head", memoryview(big), b"", bytearray(b"middle"), memoryview(big[::-1].copy()), b"tail"]
    want = _joined(parts)
    got = bytearray()

    def read():
        while len(got) < len(want):
            time.sleep(0.001)  # a slow reader: the sender's buffer fills and sendmsg takes part of what it is given
            got.extend(b.recv(65536))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        send_parts(a, parts, time.monotonic() + 60)
    finally:
        reader.join(60)
        a.close()
        b.close()
    assert bytes(got) == want
