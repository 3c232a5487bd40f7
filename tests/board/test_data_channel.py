"""The infer data channel: same results and errors as gRPC Infer, token-checked, with fallback."""
import socket

import numpy as np
import pytest

from bpuemu.board.backends import LocalBackend
from bpuemu.board.client import BoardClient
from bpuemu.common.errors import BoardUnavailable, InvalidInput, NotFound, Unauthenticated
from bpuemu.common.proto import board_pb2
from bpuemu.common.wire import ERROR, HELLO, HELLO_OK, INFER, REPLY, pack_frame, read_frame


def _hello(port, token=b""):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(pack_frame(HELLO, token))
    return s, read_frame(s)


def test_board_advertises_a_data_port(board):
    with board.client() as c:
        assert c.info.data_port > 0 and c.info.data_port != board.port


def test_data_channel_and_grpc_give_identical_outputs(board, sample_models):
    for m in sample_models.values():
        local = LocalBackend([m.path]).model().infer([m.x]).outputs
        with board.client() as fast, BoardClient(board.target, data_channel=False) as slow:
            sha = fast.ensure_model(m.path)
            fast.load(sha)
            a = fast.infer(sha, "", [m.x]).outputs
            assert fast._data is not None, "the data channel was not used"
            b = slow.infer(sha, "", [m.x]).outputs
            assert slow._data is None
        for name in local:
            assert np.array_equal(a[name], local[name]) and np.array_equal(b[name], local[name])


def test_errors_come_back_as_the_same_classes_and_the_connection_stays_usable(board, rgb_model):
    with board.client() as c:
        sha = c.ensure_model(rgb_model.path)
        c.load(sha)
        with pytest.raises(InvalidInput, match="needs 3072 bytes"):
            c.infer(sha, "", [np.zeros(7, np.uint8)])
        with pytest.raises(NotFound, match="not on this board"):
            c.infer("0" * 64, "", [rgb_model.x])
        conn = c._data
        out = c.infer(sha, "", [rgb_model.x]).outputs
        assert c._data is conn and out  # same connection, still serving


def test_raw_frames_wrong_magic_and_missing_hello_are_refused(board):
    with board.client() as c:
        port = c.info.data_port
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(pack_frame(INFER, board_pb2.InferRequest(sha256="0" * 64).SerializeToString()))
    kind, payload = read_frame(s)
    assert kind == ERROR and bytes(payload).startswith(b"UNAUTHENTICATED")
    s.close()
    s, (kind, _) = _hello(port)
    assert kind == HELLO_OK
    s.sendall(b"XXXX" + b"\0" * 5)
    assert s.recv(16) == b""  # closed, no reply
    s.close()
    assert_daemon_alive(board)


def assert_daemon_alive(board):
    with board.client() as c:
        assert c.handshake().api_version >= 1


def test_data_channel_checks_the_token(start_daemon, token_file, rgb_model):
    token = token_file.read_text().strip()
    d = start_daemon("--token-file", str(token_file))
    with d.client(token=token) as c:
        port = c.info.data_port
        sha = c.ensure_model(rgb_model.path)
        c.load(sha)
        assert c.infer(sha, "", [rgb_model.x]).outputs
        assert c._data is not None
    s, (kind, payload) = _hello(port, b"wrong-token")
    assert kind == ERROR and bytes(payload).startswith(b"UNAUTHENTICATED")
    s.close()
    s, (kind, _) = _hello(port, token.encode())
    assert kind == HELLO_OK
    s.close()
    # A client with the wrong token is refused on the data channel, falls back to gRPC, and is refused there too.
    with BoardClient(d.target, token="wrong-token-wrong-token") as bad:
        with pytest.raises(Unauthenticated):
            bad.infer(sha, "", [rgb_model.x])


def test_unreachable_data_port_falls_back_to_grpc(board, rgb_model, monkeypatch):
    with board.client() as c:
        sha = c.ensure_model(rgb_model.path)
        c.load(sha)
        info = board_pb2.BoardInfo()
        info.CopyFrom(c.info)
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        info.data_port = free.getsockname()[1]  # nobody listens there
        free.close()
        c._info = info
        out = c.infer(sha, "", [rgb_model.x]).outputs
        assert out and c._data is None and c._use_data is False


def test_daemon_killed_mid_session_is_one_clear_error(start_daemon, rgb_model):
    d = start_daemon()
    c = d.client()
    sha = c.ensure_model(rgb_model.path)
    c.load(sha)
    c.infer(sha, "", [rgb_model.x])
    d.kill()
    with pytest.raises(BoardUnavailable, match="went away|unreachable"):
        c.infer(sha, "", [rgb_model.x])
    c.close()


def test_no_data_channel_flag(start_daemon):
    d = start_daemon("--no-data-channel")
    with d.client() as c:
        assert c.info.data_port == 0
