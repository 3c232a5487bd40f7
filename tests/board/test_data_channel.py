"""The infer data channel: same results and errors as gRPC Infer, token-checked, with fallback."""
import os
import socket
import threading
import time

import numpy as np
import pytest

from bpuemu.board.backends import LocalBackend
from bpuemu.board.client import BoardClient, _DataChannel
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


def _allowed_cpus(pid: int, tid: int) -> str:
    """The CPUs thread ``tid`` of process ``pid`` may run on, as the kernel lists them (e.g. "0-1", "1")."""
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        return next(line.split(":")[1].strip() for line in f if line.startswith("Cpus_allowed_list:"))


def _threads_on_one_cpu(pid: int) -> set:
    """The single CPUs that threads of process ``pid`` are kept on now."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            cpus = _allowed_cpus(pid, int(tid))
        except (OSError, StopIteration):  # the thread ended meanwhile
            continue
        if cpus.isdigit():
            found.add(cpus)
    return found


def _watch_call(call, board_pid: int) -> tuple:
    """Run ``call`` in a thread: (the CPU lists that thread had while it ran, the single CPUs the board's threads
    were kept on once it was over, the thread's CPUs after the call). The board places a connection's thread
    when a request comes: until then it stays where the last call left it."""
    tid, after = [], []

    def run():
        tid.append(threading.get_native_id())
        call()
        after.append(os.sched_getaffinity(0))

    t = threading.Thread(target=run)
    t.start()
    mine = set()
    while t.is_alive():
        if tid:
            try:
                mine.add(_allowed_cpus(os.getpid(), tid[0]))
            except (OSError, StopIteration):  # the thread ended between the check and the read
                pass
        time.sleep(0.002)
    t.join()
    return mine, _threads_on_one_cpu(board_pid), after[0]


LONG_CALL = 3000  # frames of the sample model: a call long enough to watch (~0.2-0.5 s)
needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="keeping a call on one CPU needs two")


@needs_two_cpus
def test_a_lone_call_to_a_board_on_this_machine_runs_on_one_cpu_at_both_ends(start_daemon, rgb_model):
    """The client's thread waits on the CPU it sent from, the board runs the call on that CPU, and the client's
    thread has its CPUs back after; BoardClient(keep_cpu=False) and hrt_boardd --no-follow-client-cpu opt out."""
    everywhere = os.sched_getaffinity(0)
    listed = _allowed_cpus(os.getpid(), threading.get_native_id())
    for flags, keep_cpu in (((), True), ((), False), (("--no-follow-client-cpu",), True)):
        d = start_daemon(*flags)
        with d.client(keep_cpu=keep_cpu) as c:
            sha = c.ensure_model(rgb_model.path)
            c.load(sha)
            c.infer(sha, "", [rgb_model.x])
            assert c._data is not None and c._data.keep_cpu is keep_cpu
            mine, board, after = _watch_call(lambda: c.infer(sha, "", [rgb_model.x], frame_count=LONG_CALL),
                                             d.proc.pid)
        kept = {s for s in mine if s.isdigit()}
        assert after == everywhere, "the caller's CPUs are its own again after the call"
        if not keep_cpu:
            assert mine == {listed}, f"keep_cpu=False: the waiting thread was allowed {mine}"
            continue
        assert len(kept) == 1 and mine <= kept | {listed}, f"the waiting thread was allowed {mine}"
        if flags:
            assert not board, f"--no-follow-client-cpu: board threads kept on CPU {board}"
        else:
            assert board == kept, f"the client waited on CPU {kept}; the board's threads were kept on {board}"


@needs_two_cpus
def test_calls_beside_other_calls_or_connections_run_anywhere(start_daemon, rgb_model, monkeypatch):
    """Two calls under way in one process: neither is kept on a CPU, nor is the next call soon after (threads
    that call side by side). Two data channel connections open on the board: it runs neither's calls on one
    CPU."""
    monkeypatch.setattr(_DataChannel, "TOGETHER_S", 60.0)  # "soon after": however slow this machine is today
    d = start_daemon()
    listed = _allowed_cpus(os.getpid(), threading.get_native_id())
    with d.client() as first, d.client() as second:
        sha = first.ensure_model(rgb_model.path)
        first.load(sha)
        for c in (first, second):
            c.infer(sha, "", [rgb_model.x])
        started = threading.Event()
        first_seen = []

        def first_call():
            started.set()
            first_seen.append(_watch_call(lambda: first.infer(sha, "", [rgb_model.x], frame_count=4 * LONG_CALL),
                                          d.proc.pid))

        t = threading.Thread(target=first_call)
        t.start()
        started.wait()
        time.sleep(0.05)  # the first call is under way (kept on its CPU: it was alone in this process)
        mine, board, _ = _watch_call(lambda: second.infer(sha, "", [rgb_model.x], frame_count=LONG_CALL), d.proc.pid)
        t.join()
        then, _, _ = _watch_call(lambda: first.infer(sha, "", [rgb_model.x], frame_count=LONG_CALL), d.proc.pid)
    assert then == {listed}, f"a call soon after two calls were under way together was allowed {then}"
    assert mine == {listed}, f"the second call's thread was allowed {mine} while the first call was under way"
    assert any(s.isdigit() for s in first_seen[0][0]), "the first call, alone when it started, was not kept"
    assert not board and not first_seen[0][1], f"the board, with two connections, kept threads on {board}"
