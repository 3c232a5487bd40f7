"""The data channel's tensors without copies: what the client sends as buffers and what the board views in
the received frame are the protobuf messages gRPC carries, byte for byte in meaning, for large tensors and
small ones alike; and over a connection's stream of calls, where each end keeps the bytes around the data
from the last call, each call is still its own message."""
import socket
import threading
import time

import numpy as np
import pytest

from bpuemu.board.backends import LocalBackend
from bpuemu.board.client import BoardClient
from bpuemu.board.messages import (
    ZERO_COPY_BYTES,
    ReplyFrames,
    ReplyParser,
    RequestFrames,
    RequestParser,
    infer_reply,
    infer_request,
    request_inputs,
)
from bpuemu.board.runtime.infer import InferResult
from bpuemu.common.errors import InvalidInput
from bpuemu.common.proto import board_pb2
from bpuemu.common.wire import (
    DATA_HEADER, ERROR, HELLO, HELLO_OK, INFER, KERNEL_SLACK_S, REPLY, FrameReader, FrameWriter, frame_parts,
    pack_frame, read_frame, send_parts,
)

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


def _reply_frame(frames, result):
    """The REPLY frame ``frames`` (a ReplyFrames) sends for ``result``, joined; the size it gives is the frame's."""
    parts, size = frames.parts(result)
    frame = _joined(parts)
    assert size == len(frame)
    return frame


def infer_request_parts(*args):
    """The payload of the INFER frame a fresh connection sends."""
    return [_joined(RequestFrames().parts(*args))[DATA_HEADER.size:]]


def infer_result_from_buffer(buf):
    return ReplyParser().parse(buf, copy=False)


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
        request, got = RequestParser().parse(memoryview(buf)[:len(encoded)])
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
    frame = _reply_frame(ReplyFrames(), result)
    sent = frame[DATA_HEADER.size:]
    assert board_pb2.InferReply.FromString(sent) == want
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


@pytest.mark.parametrize("sender", ["send_parts", "FrameWriter"])
def test_send_parts_sends_every_byte_in_order_when_the_kernel_takes_them_in_pieces(sender):
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    big = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    # Arrays as they are (FrameWriter takes any buffer: the board sends onnxruntime's outputs so), views, bytes.
    parts = [b"head", memoryview(big), b"", bytearray(b"middle"), big[::-1].copy().reshape(1024, 1024), b"tail"]
    parts = frame_parts(REPLY, parts)  # a frame: FrameWriter reads its size from its header
    want = _joined(parts)
    got = bytearray()

    def read():
        while len(got) < len(want):
            time.sleep(0.001)  # a slow reader: the sender's buffer fills and sendmsg takes part of what it is given
            got.extend(b.recv(65536))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        if sender == "send_parts":
            send_parts(a, parts, time.monotonic() + 60)
        else:
            FrameWriter(a).send(parts, time.monotonic() + 60)
    finally:
        reader.join(60)
        a.close()
        b.close()
    assert bytes(got) == want


def test_frame_writer_deadline_holds_for_a_peer_that_does_not_read():
    """A peer that takes none of a frame: the send ends at its deadline (kept by the kernel on a plain socket),
    not when the kernel's buffers free up; the same for a TLS-like socket that keeps Python's timeouts."""
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    frame = frame_parts(REPLY, [bytes(1 << 20)])
    writer = FrameWriter(a)
    try:
        t0 = time.monotonic()
        with pytest.raises(socket.timeout):
            writer.send(frame, time.monotonic() + 2.0)
        assert 1.9 < time.monotonic() - t0 < 2.0 + KERNEL_SLACK_S + 1.0
        t0 = time.monotonic()  # a second frame's deadline too: the kernel's timeout from the first does not last
        with pytest.raises(socket.timeout):
            writer.send(frame, time.monotonic() + 0.2)
        assert time.monotonic() - t0 < 0.2 + KERNEL_SLACK_S + 1.0
    finally:
        a.close()
        b.close()


def test_frame_reader_deadline_holds_for_a_peer_that_trickles():
    """Bytes that come one at a time, each well within the kernel's timeout for one read: the whole frame's
    deadline still ends the read."""
    a, b = socket.socketpair()
    reader = FrameReader(b, keep_bytes=1000)
    frame = pack_frame(REPLY, b"t" * 100)
    stop = threading.Event()

    def trickle():
        for i in range(len(frame)):
            if stop.wait(0.02):
                return
            a.send(frame[i:i + 1])

    sender = threading.Thread(target=trickle)
    sender.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(socket.timeout):  # the whole frame would take 2.2 s
            reader.frame(time.monotonic() + 0.5)
        assert time.monotonic() - t0 < 0.5 + KERNEL_SLACK_S + 0.5
    finally:
        stop.set()
        sender.join()
        a.close()
        b.close()


# --- a connection's stream of calls: the bytes around the data kept from the last call --------------------------

def _request_args(sha, name, inputs):
    return (sha, name, inputs, ("a", "b", "c", "d", "e"), False, 1, 0)


@pytest.mark.parametrize("scale", [1, 40])
def test_request_frames_of_a_stream_are_each_calls_own_message(scale):
    frames = RequestFrames()
    for seed, sha, name in ((scale, "ab" * 32, "m"), (scale + 1, "ab" * 32, "m"), (scale + 2, "cd" * 32, "n")):
        args = _request_args(sha, name, _inputs(seed))
        frame = _joined(frames.parts(*args))
        assert frame[:DATA_HEADER.size] == pack_frame(INFER, frame[DATA_HEADER.size:])[:DATA_HEADER.size]
        assert board_pb2.InferRequest.FromString(frame[DATA_HEADER.size:]) == infer_request(*args)
        assert frame == _joined(RequestFrames().parts(*args))  # as a fresh connection's first call
    with pytest.raises(InvalidInput, match="cannot be sent"):
        frames.parts("ab" * 32, "", [np.zeros(4, dtype=object)])


def test_request_frames_of_one_form_in_a_row_are_each_calls_own_message():
    """Calls with C-contiguous inputs of one form in a row (the usual stream: the last call's bytes reused as
    they are), then calls that differ from the last in one thing only: each frame is the call's own message."""
    frames = RequestFrames()
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, (1, 8, 8, 3), dtype=np.uint8)
    names = ["a"]
    calls = [("ab" * 32, "m", [x], names), ("ab" * 32, "m", [x + 1], names), ("ab" * 32, "m", [x + 2], names),
             ("ab" * 32, "m", [x.astype(np.int8)], names),            # another dtype, the same shape and bytes
             ("ab" * 32, "m", [x.reshape(1, 3, 8, 8)], names),        # another shape, the same size
             ("ab" * 32, "n", [x.reshape(1, 3, 8, 8)], names),        # another model name of the same length
             ("ab" * 32, "n", [x.reshape(1, 3, 8, 8)], names),        # names: the same list, changed in place
             ("ab" * 32, "n", [x[:, ::2]], names)]                    # not C-contiguous
    for i, (sha, name, inputs, input_names) in enumerate(calls):
        if i == 6:
            names[0] = "b"
        args = (sha, name, inputs, tuple(input_names), False, 1, 0)
        frame = _joined(frames.parts(sha, name, inputs, input_names))
        assert board_pb2.InferRequest.FromString(frame[DATA_HEADER.size:]) == infer_request(*args), i
        assert frame == _joined(RequestFrames().parts(*args)), i


@pytest.mark.parametrize("scale", [1, 40])
def test_request_parser_reads_each_request_of_a_stream_as_protobuf_does(scale):
    parser = RequestParser()
    buf = bytearray(1 << 20)  # one kept buffer, as the board's connection has
    # The same form, other data; then fields of the same length that differ (model name, frame count, sha).
    calls = [("ab" * 32, "m", 1, _inputs(scale)), ("ab" * 32, "m", 1, _inputs(scale + 1)),
             ("ab" * 32, "n", 1, _inputs(scale + 1)), ("ab" * 32, "n", 2, _inputs(scale + 2)),
             ("cd" * 32, "n", 2, _inputs(scale + 2))]
    for sha, name, frames, inputs in calls:
        args = (sha, name, inputs, ("a", "b", "c", "d", "e"), False, frames, 0)
        encoded = _joined(infer_request_parts(*args))
        buf[:len(encoded)] = encoded
        request, got = parser.parse(memoryview(buf)[:len(encoded)])
        assert (request.sha256, request.model_name, request.frame_count) == (sha, name, frames)
        want = request_inputs(infer_request(*args))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    with pytest.raises(ValueError):
        parser.parse(memoryview(bytearray(encoded[:-1])))  # cut short: the same length no more, parsed in full


def test_request_parser_reads_requests_read_into_one_place_and_elsewhere():
    """The board's stream of calls: requests of one size read by a FrameReader into the same place (the same
    view each time: the parser keeps the arrays it made of it), with other data and other fields of the same
    length; between them, one of the same size elsewhere. Each is read as protobuf reads it."""
    a, b = socket.socketpair()
    reader, parser = FrameReader(b, keep_bytes=1 << 20), RequestParser()
    rng = np.random.default_rng(11)
    seen = []
    try:
        for i, (name, frames) in enumerate((("m", 1), ("m", 1), ("m", 1), ("m", 1), ("n", 1), ("n", 2), ("n", 2),
                                            ("n", 2))):
            args = ("ab" * 32, name, [rng.integers(0, 256, (1, 30, 40, 3), dtype=np.uint8)], ("x",), False, frames, 0)
            frame = _joined(RequestFrames().parts(*args))
            if i in (2, 7):  # the same size and form as the last call, elsewhere: a buffer of its own
                payload = memoryview(bytearray(frame[DATA_HEADER.size:]))
            else:
                a.sendall(frame)
                kind, payload = reader.frame(time.monotonic() + 10)
                seen.append(payload)
            sha, got_name, got_frames, dump, got = parser.call(payload)  # as the data channel reads a request
            want = infer_request(*args)
            assert (sha, got_name, got_frames, dump) == ("ab" * 32, name, frames, False), i
            assert len(got) == 1 and np.array_equal(got[0], request_inputs(want)[0]), i
        assert all(v is seen[0] for v in seen[1:])  # the reader gave the same view each time
    finally:
        a.close()
        b.close()


def test_reply_frames_and_parser_carry_each_reply_of_a_stream():
    rng = np.random.default_rng(5)
    frames, parser = ReplyFrames(), ReplyParser()
    buf = bytearray(1 << 20)
    kept = []
    # Runs of replies of one form (the latencies and the data differ), then of another.
    for i, (latencies, inter) in enumerate((([1.5], False), ([2.25], False), ([0.5], False), ([3.0, 4.0], True),
                                            ([3.5, 1.0], True), ([], False), ([5.5], False), ([6.5], False),
                                            ([7.5], False), ([8.5], False), ([9.5], False))):
        n = np.arange(6).reshape(2, 3) + i
        if i >= 8:  # one thing unlike the last reply: the dtype, then the shape, then the name (the same size)
            n = n.astype(np.int32) if i == 8 else n.reshape(3, 2)
        outputs = {"prob": rng.random((4, 10)).astype(np.float32), "n" if i < 10 else "m": n}
        result = InferResult(outputs, {"inter": rng.integers(-128, 128, (2, 2), dtype=np.int8)} if inter else {},
                             latencies)
        frame = _reply_frame(frames, result)
        encoded = frame[DATA_HEADER.size:]
        assert frame == _reply_frame(ReplyFrames(), result)  # as a fresh connection's first reply
        assert board_pb2.InferReply.FromString(encoded) == infer_reply(result)
        buf[:len(encoded)] = encoded  # each reply into the same buffer, as the client's reader does
        got = parser.parse(memoryview(buf)[:len(encoded)], copy=True)
        assert got.latency_ms == latencies and list(got.outputs) == list(outputs)
        assert list(got.intermediates) == list(result.intermediates)
        kept.append((result, got))
    for result, got in kept:  # copies: the later replies read into the buffer did not change them
        for name, a in {**result.outputs, **result.intermediates}.items():
            b = got.outputs.get(name, got.intermediates.get(name))
            assert b.dtype == a.dtype and np.array_equal(a, b), name


def test_frame_reader_reads_frames_as_they_come():
    a, b = socket.socketpair()
    try:
        reader = FrameReader(b, keep_bytes=1000, size=64)
        big = bytes(range(256)) * 20  # over keep_bytes: read into a buffer of its own
        a.sendall(pack_frame(HELLO, b"tok") + pack_frame(INFER, big) + pack_frame(REPLY, b"x" * 500))  # at once
        deadline = time.monotonic() + 10
        kind, tok = reader.frame(deadline)
        assert (kind, bytes(tok)) == (HELLO, b"tok")
        kind, own = reader.frame(deadline)
        assert (kind, bytes(own)) == (INFER, big)
        kind, small = reader.frame(deadline)
        assert (kind, bytes(small)) == (REPLY, b"x" * 500)
        # The kept buffer grew to hold such a frame whole, header and all, from its front: the next one is read
        # in place, not moved down after its header (a copy of the whole payload on every call).
        assert len(reader._buf) >= DATA_HEADER.size + 500
        assert bytes(own) == big  # its own buffer: later reads did not touch it

        frame = pack_frame(REPLY, b"y" * 900)

        def trickle():
            for i in range(0, len(frame), 100):
                a.sendall(frame[i:i + 100])
                time.sleep(0.01)

        sender = threading.Thread(target=trickle)
        sender.start()
        kind, got = reader.frame(time.monotonic() + 10)
        sender.join()
        assert (kind, bytes(got)) == (REPLY, b"y" * 900)

        a.sendall(frame[:50])
        t0 = time.monotonic()
        with pytest.raises(socket.timeout):  # the deadline holds for the whole frame
            reader.frame(time.monotonic() + 0.3)
        assert time.monotonic() - t0 < 5
    finally:
        a.close()
        b.close()
    a, b = socket.socketpair()
    try:
        reader = FrameReader(b, keep_bytes=1000)
        a.sendall(pack_frame(REPLY, b"z" * 10) + b"QQQQ\x04\x00\x00\x00\x00")
        assert bytes(reader.frame(time.monotonic() + 10)[1]) == b"z" * 10
        with pytest.raises(ValueError, match="magic"):
            reader.frame(time.monotonic() + 10)
        reader = FrameReader(b, keep_bytes=1000)
        a.sendall(frame[:50])
        a.close()
        with pytest.raises(ConnectionError, match="mid-frame"):
            reader.frame(time.monotonic() + 10)
    finally:
        a.close()
        b.close()


def test_two_models_in_turn_on_one_connection_each_get_their_own_answer(board, big_model, tmp_path):
    from bpuemu.host.samples import sample_bin

    small_model = str(tmp_path / "small.bin")
    sample_bin(small_model, "rgb", "NHWC", 32, 32)
    rng = np.random.default_rng(7)
    with board.client() as c:
        shas = {}
        for path in (big_model, small_model):
            shas[path] = c.ensure_model(path)
            c.load(shas[path])
        local = {path: LocalBackend([path]).model() for path in shas}
        for path in (big_model, small_model, small_model, big_model, small_model):
            size = BIG if path == big_model else 32
            x = rng.integers(0, 256, (1, size, size, 3), dtype=np.uint8)
            got = c.infer(shas[path], "", [x]).outputs
            assert c._data is not None, "the data channel was not used"
            want = local[path].infer([x]).outputs
            assert list(got) == list(want)
            assert all(np.array_equal(got[n], a) for n, a in want.items())


def test_calls_of_several_models_in_turn_are_each_parsed_in_full_once(monkeypatch):
    """An OCR pipeline calls its classifier and recogniser in turn on one connection: each form is kept."""
    import bpuemu.board.messages as messages

    full = []
    layout = messages.tensor_layout
    monkeypatch.setattr(messages, "tensor_layout", lambda *a: full.append(1) or layout(*a))
    frames, parser = RequestFrames(), RequestParser()
    rng = np.random.default_rng(9)
    forms = [("ab" * 32, "cls", (1, 48, 192, 3)), ("cd" * 32, "rec", (1, 48, 320, 3)), ("ef" * 32, "det", (1, 8, 8, 3))]
    for i in range(12):
        sha, name, shape = forms[i % 3]
        x = rng.integers(0, 256, shape, dtype=np.uint8)
        encoded = _joined(frames.parts(sha, name, [x]))[DATA_HEADER.size:]
        request, (got,) = parser.parse(memoryview(bytearray(encoded)))
        assert (request.sha256, request.model_name) == (sha, name) and np.array_equal(got, x)
    assert len(full) == 3
