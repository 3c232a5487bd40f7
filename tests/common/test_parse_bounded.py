"""bpuemu.common.wire.parse_bounded: a message is parsed only when its parse takes at most a bounded multiple
of its size; bombs (packed varints, empty sub-messages) are refused before protobuf allocates them."""
import time

import pytest
from google.protobuf.message import DecodeError

from bpuemu.common.proto import board_pb2
from bpuemu.common.wire import GROWTH_FACTOR, GROWTH_SLACK_BYTES, MessageTooLarge, parse_bounded, parse_cost


def _request(data_bytes: int, dims=(1, 3, 224, 224)) -> board_pb2.InferRequest:
    r = board_pb2.InferRequest(sha256="a" * 64, model_name="m", frame_count=2)
    t = r.inputs.add(name="x", dtype="uint8", data=bytes(data_bytes))
    t.shape.extend(dims)
    return r


def test_honest_requests_parse_as_protobuf_parses_them():
    for r in (_request(0), _request(3 * 224 * 224), _request(8 << 20)):
        data = r.SerializeToString()
        assert parse_bounded(board_pb2.InferRequest, data) == r
    assert parse_bounded(board_pb2.StatsRequest, b"") == board_pb2.StatsRequest()


def test_a_shape_of_packed_varints_is_refused_quickly():
    r = board_pb2.InferRequest()
    r.inputs.add().shape.extend([1] * (4 << 20))  # 4 MiB on the wire, 32 MiB parsed
    started = time.perf_counter()
    with pytest.raises(MessageTooLarge):
        parse_bounded(board_pb2.InferRequest, r.SerializeToString())
    assert time.perf_counter() - started < 1.0


def test_many_empty_sub_messages_are_refused():
    r = board_pb2.InferRequest()
    for _ in range(200_000):  # 400 KB on the wire, an object each parsed
        r.inputs.add()
    with pytest.raises(MessageTooLarge):
        parse_bounded(board_pb2.InferRequest, r.SerializeToString())


def test_the_estimate_stays_within_the_bound_for_honest_messages():
    data = _request(1 << 20).SerializeToString()
    cost = parse_cost(board_pb2.InferRequest.DESCRIPTOR, memoryview(data), float("inf"))
    assert len(data) <= cost <= GROWTH_FACTOR * len(data) + GROWTH_SLACK_BYTES


@pytest.mark.parametrize("junk", [b"\x0a\xff\xff\xff\xff\x0f", b"\x80" * 11, b"\x0b"])
def test_bytes_that_are_not_a_message_are_refused(junk):
    with pytest.raises(DecodeError):  # small: protobuf's own parse refuses them
        parse_bounded(board_pb2.InferRequest, junk)
    with pytest.raises(MessageTooLarge):  # walked (as a large message is): the walk refuses them
        parse_cost(board_pb2.InferRequest.DESCRIPTOR, memoryview(junk), float("inf"))
