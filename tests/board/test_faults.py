"""Faults injected for real: the daemon killed mid-call, its disk full, a bad network.

Every test runs the real hrt_boardd in a subprocess on loopback and drives it
with the real hrt_model_exec CLI (a subprocess) or the real BoardClient:

- SIGKILL of the daemon mid-upload, mid-perf, mid-infer (gRPC and the data
  channel): the client prints one ERROR line naming the board and what was
  cut, exits non-zero; a daemon restarted on the same model dir serves the
  store, which holds no partial model, and the upload runs again cleanly.
- The store's disk full (RLIMIT_FSIZE, SIGXFSZ ignored so write() fails with
  EFBIG): the upload is RESOURCE_EXHAUSTED, leaves nothing behind, and the
  models already there keep serving.
- A network that stalls, trickles or resets (tests/board/fault_proxy.py,
  between client and daemon for gRPC and the data channel): every call ends
  within its deadline with a clear message, and a farm keeps the results of
  the boards that answered.
"""
import os
import resource
import signal
import time

import pytest

from bpuemu.board.client import BoardClient, Deadlines
from bpuemu.board.farm import BoardAccess, FarmClient
from bpuemu.board.runtime.perf_job import PerfConfig
from bpuemu.common.errors import BoardUnavailable, DeadlineExceeded, ResourceExhausted

from boardd_harness import (
    Daemon,
    assert_daemon_serves,
    assert_ok,
    assert_one_error,
    assert_store_clean,
    clean_env,
    finish_cli,
    run_cli,
    start_cli,
    wait_until,
)
from fault_proxy import FaultProxy

#: hrt_model_exec infer's note when it makes random inputs (stderr, not an error).
RANDOM_NOTE = r"^no --input_file given"
#: Frames that keep one infer call busy for a few seconds on the 32x32 sample.
LONG_INFER_FRAMES = 40000


def _upload_files(daemon: Daemon) -> list:
    return [f for f in os.listdir(daemon.model_dir) if f.startswith(".upload-")]


def _jobs_running(daemon: Daemon) -> int:
    with daemon.client() as c:
        return c.stats().jobs_running


def _restart(daemon: Daemon) -> Daemon:
    """A new daemon on the killed one's model dir and port."""
    return Daemon(daemon.workdir, port=daemon.port).start()


@pytest.fixture
def daemons():
    """Daemons a test starts itself; all stopped (or killed) at the end."""
    started = []
    yield started
    for d in started:
        d.stop()
        d.kill()


@pytest.fixture
def proxied(daemons, tmp_path_factory):
    """A daemon and a FaultProxy in front of its gRPC port and its data channel port."""
    d = Daemon(tmp_path_factory.mktemp("proxied_board")).start()
    daemons.append(d)
    with d.client() as c:
        data_port = c.info.data_port
    proxy = FaultProxy({d.port: ("127.0.0.1", d.port), data_port: ("127.0.0.1", data_port)}).start()
    try:
        yield d, proxy, f"{proxy.host}:{d.port}"
    finally:
        proxy.stop()


# --- the daemon killed mid-call ----------------------------------------------------------

def test_daemon_killed_mid_upload(proxied, daemons, rgb_model, scratch):
    d, proxy, target = proxied
    proxy.up_rate = 2000  # a 10 KB model takes ~5 s to upload: time to kill the daemon mid-way
    cli = start_cli(["model_info", "--model_file", rgb_model.path, "--board", target], scratch)
    assert wait_until(lambda: _upload_files(d), timeout=30), "the upload never started"
    d.kill()
    line = assert_one_error(finish_cli(cli), target, "upload of sample_rgb.bin")
    assert "went away" in line or "unreachable" in line, line
    proxy.up_rate = 0
    restarted = _restart(d)
    daemons.append(restarted)
    assert restarted.store_files() == [], "a partial upload survived the restart"
    # The upload runs again from the start, and the board serves the model.
    assert_ok(run_cli(["model_info", "--model_file", rgb_model.path, "--board", target], scratch))
    assert_daemon_serves(restarted, rgb_model.path, rgb_model.x)


@pytest.mark.parametrize("command", ["perf", "infer_grpc", "infer_data_channel"])
def test_daemon_killed_mid_job(daemons, tmp_path_factory, rgb_model, scratch, command):
    d = Daemon(tmp_path_factory.mktemp("killed_board")).start()
    daemons.append(d)
    env = clean_env(**({"BPUEMU_NO_DATA_CHANNEL": "1"} if command == "infer_grpc" else {}))
    if command == "perf":
        args = ["perf", "--perf_time", "0.2"]
        what = "during perf"
    else:
        args = ["infer", "--frame_count", LONG_INFER_FRAMES]
        what = "during infer"
    cli = start_cli([*args, "--model_file", rgb_model.path, "--board", d.target], scratch, env)
    assert wait_until(lambda: cli.poll() is None and _jobs_running(d) == 1, timeout=30), "the job never started"
    d.kill()
    line = assert_one_error(finish_cli(cli), d.target, what, ignore=RANDOM_NOTE)
    assert "went away" in line, line
    assert os.listdir(scratch) == []  # no result files from a failed run
    restarted = _restart(d)
    daemons.append(restarted)
    assert_store_clean(restarted)
    assert len(restarted.store_files()) == 2  # the model it had: <sha>.bin and <sha>.json
    assert_daemon_serves(restarted, rgb_model.path, rgb_model.x)


def test_restart_removes_what_a_crash_left(daemons, tmp_path_factory, rgb_model):
    """A crash between the store's two renames (or mid-upload) leaves files a restart removes."""
    workdir = tmp_path_factory.mktemp("crashed_store")
    models = workdir / "models"
    models.mkdir()
    (models / ".upload-abc123").write_bytes(b"half a model")
    (models / ".upload-abc123.json").write_text('{"file_name": "m.bin"}')
    (models / ("ab" * 32 + ".json")).write_text('{"file_name": "never_published.bin"}')
    d = Daemon(workdir).start()
    daemons.append(d)
    assert d.store_files() == []
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)
    assert len(d.store_files()) == 2


def test_farm_board_killed_mid_infer(daemons, tmp_path_factory, rgb_model, scratch):
    """hrt_model_exec infer on two boards, one SIGKILLed mid-call: one ERROR line naming it; the other's result kept."""
    boards = [Daemon(tmp_path_factory.mktemp(f"farm_killed{i}")).start() for i in range(2)]
    daemons.extend(boards)
    kept, victim = boards
    cli = start_cli(["infer", "--model_file", rgb_model.path, "--board", f"{kept.target},{victim.target}",
                "--frame_count", LONG_INFER_FRAMES], scratch)
    assert wait_until(lambda: cli.poll() is None and _jobs_running(victim) == 1, timeout=30), "the job never started"
    victim.kill()
    result = finish_cli(cli)
    line = assert_one_error(result, "infer failed on 1 of 2 boards", victim.target, "went away during infer",
                            ignore=RANDOM_NOTE)
    assert kept.target not in line
    assert f"=== board {kept.target} " in result.stdout and f"=== board {victim.target} " not in result.stdout
    assert result.stdout.count("infer success") == 1, result.stdout


# --- the store's disk full ------------------------------------------------------------------

def _file_size_limit(limit: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def test_store_disk_full(daemons, tmp_path_factory, sample_models, scratch):
    workdir = tmp_path_factory.mktemp("full_board")
    have, new = sample_models["rgb"], sample_models["nv12"]
    first = Daemon(workdir).start()
    daemons.append(first)
    with first.client() as c:
        c.ensure_model(have.path)
    first.stop()
    os.replace(first.log_path, first.log_path + ".1")  # the limit applies to the daemon's log too
    limit = os.path.getsize(new.path) // 2
    full = Daemon(workdir, preexec_fn=_file_size_limit(limit)).start()
    daemons.append(full)
    before = full.store_files()
    with full.client() as c:
        with pytest.raises(ResourceExhausted, match="no space|full") as err:
            c.ensure_model(new.path)
        assert full.target in str(err.value)
    assert full.store_files() == before and not _upload_files(full)
    line = assert_one_error(run_cli(["model_info", "--model_file", new.path, "--board", full.target], scratch),
                            full.target, "upload")
    assert "no space" in line or "full" in line, line
    assert full.store_files() == before
    assert_daemon_serves(full, have.path, have.x)  # the models it has still serve


# --- a bad network between client and daemon ---------------------------------------------------

SHORT = Deadlines(connect=2.0, call=2.0, infer=2.0, upload_base=2.0, perf_margin=2.0, perf_frame_budget_s=0.01)


def _timed(fn):
    t0 = time.monotonic()
    try:
        fn()
    except (DeadlineExceeded, BoardUnavailable) as exc:
        return exc, time.monotonic() - t0
    raise AssertionError("the call succeeded through a stalled network")


def test_stalled_network_every_call_ends_within_its_deadline(proxied, rgb_model, tmp_path):
    d, proxy, target = proxied
    with BoardClient(target, deadlines=SHORT) as warm:  # the model is there, a data channel connection is open
        sha = warm.ensure_model(rgb_model.path)
        warm.load(sha)
        warm.infer(sha, "", [rgb_model.x])
        assert warm._data is not None
        proxy.stall()
        calls = {
            "infer over the data channel": lambda: warm.infer(sha, "", [rgb_model.x]),
        }
        fresh = BoardClient(target, deadlines=SHORT, data_channel=False)
        calls.update({
            "handshake": lambda: fresh.handshake(),
            "HasModel": lambda: warm.has_model(sha),
            "upload": lambda: warm.upload(rgb_model.path),
            "infer over gRPC": lambda: BoardClient(target, deadlines=SHORT, data_channel=False).infer(sha, "", [rgb_model.x]),
            "perf": lambda: warm.perf(sha, "", PerfConfig(frame_count=10)),
            "ListModels": lambda: warm.list_models(),
        })
        for what, call in calls.items():
            exc, elapsed = _timed(call)
            assert target in str(exc), (what, str(exc))
            assert elapsed < 2.0 + 3.0, f"{what} took {elapsed:.1f} s with a 2 s deadline"
            assert "did not answer" in str(exc) or "went away" in str(exc), (what, str(exc))
        fresh.close()
    proxy.unstall()
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def test_trickling_data_channel_reply_ends_within_its_deadline(proxied, rgb_model):
    """A reply that arrives a little at a time must not extend the call past its deadline."""
    d, proxy, target = proxied
    deadlines = Deadlines(infer=1.0)
    with BoardClient(target, deadlines=deadlines) as c:
        sha = c.ensure_model(rgb_model.path)
        reply = c.infer(sha, "", [rgb_model.x], dump_intermediate=True)
        size = sum(a.nbytes for a in reply.intermediates.values())
        assert c._data is not None and size > 2000
        proxy.down_rate = size // 4  # ~4 s for the reply, each piece well within 1 s of the last
        exc, elapsed = _timed(lambda: c.infer(sha, "", [rgb_model.x], dump_intermediate=True))
    assert isinstance(exc, DeadlineExceeded) and target in str(exc), str(exc)
    assert elapsed < 1.0 + 1.5, f"infer took {elapsed:.1f} s with a 1 s deadline"


@pytest.mark.parametrize("when", ["upload", "perf", "infer", "infer_grpc"])
def test_connection_reset_mid_call_is_one_clear_error(proxied, rgb_model, sample_models, when):
    """The client fails at once with one clear error; the board drops the caller's job and keeps serving."""
    d, proxy, target = proxied
    with BoardClient(target, deadlines=SHORT, data_channel=when != "infer_grpc") as c:
        sha = c.ensure_model(rgb_model.path)
        if when == "upload":
            proxy.reset_after_bytes = 4000  # of the 10 KB model (the handshake and HasModel send far less)
            call = lambda: c.ensure_model(sample_models["nv12"].path)  # noqa: E731
        elif when == "perf":
            call = lambda: c.perf(sha, "", PerfConfig(perf_time_minutes=0.1))  # noqa: E731
        else:
            call = lambda: c.infer(sha, "", [rgb_model.x], frame_count=LONG_INFER_FRAMES)  # noqa: E731
        if when != "upload":
            proxy_timer = _later(1.0, proxy.reset_all)
        exc, elapsed = _timed(call)
        if when != "upload":
            proxy_timer.join()
    assert isinstance(exc, BoardUnavailable), str(exc)
    assert target in str(exc) and ("went away" in str(exc) or "unreachable" in str(exc)), str(exc)
    proxy.reset_after_bytes = None
    assert wait_until(lambda: not _upload_files(d) and _jobs_running(d) == 0, timeout=30)
    if when.startswith("infer"):  # the job stopped when its caller went away, not at its last frame
        with d.client() as c:
            assert c.stats().infer_frames < LONG_INFER_FRAMES
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def _later(delay: float, fn):
    import threading

    t = threading.Timer(delay, fn)
    t.start()
    return t


def test_farm_keeps_the_boards_that_answered(proxied, daemons, tmp_path_factory, rgb_model, scratch):
    d, proxy, bad = proxied
    good = [Daemon(tmp_path_factory.mktemp(f"good_board{i}")).start() for i in range(2)]
    daemons.extend(good)
    boards = [good[0].target, bad, good[1].target]
    # Through the library with short deadlines: the bad board stalls mid-job.
    stall = _later(1.5, proxy.stall)
    with FarmClient(boards, [rgb_model.path], BoardAccess(deadlines=Deadlines(perf_margin=2.0))) as farm:
        run = farm.perf("", PerfConfig(perf_time_minutes=0.05))
    stall.join()
    by_target = {o.target: o for o in run.outcomes}
    assert by_target[bad].error is not None and bad in str(by_target[bad].error)
    assert isinstance(by_target[bad].error, DeadlineExceeded), str(by_target[bad].error)
    assert all(by_target[g.target].ok and by_target[g.target].value.report.frame_count > 0 for g in good)
    assert run.summary.succeeded == 2
    # Through the CLI: the stalled board is one row FAILED and one ERROR line; the others' rows stay.
    result = run_cli(["perf", "--model_file", rgb_model.path, "--board", ",".join(boards), "--frame_count", "20"],
                     scratch, timeout=90)
    line = assert_one_error(result, "perf failed on 1 of 3 boards", bad)
    assert good[0].target not in line and good[1].target not in line
    for g in good:
        assert f"=== board {g.target} " in result.stdout
    assert "3 boards, 2 succeeded, 1 failed" in result.stdout
    proxy.unstall()
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


# --- the daemon's own deadlines: a client that trickles cannot hold a connection ----------

@pytest.fixture
def strict_proxied(daemons, tmp_path_factory):
    """A daemon with a 2 s call deadline (and metrics), behind a FaultProxy; yields (daemon, proxy, data port, metrics url)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    d = Daemon(tmp_path_factory.mktemp("strict_board"), "--call-deadline", "2",
               "--metrics-listen", f"127.0.0.1:{metrics_port}").start()
    daemons.append(d)
    with d.client() as c:
        data_port = c.info.data_port
    proxy = FaultProxy({d.port: ("127.0.0.1", d.port), data_port: ("127.0.0.1", data_port)}).start()
    try:
        yield d, proxy, data_port, f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        proxy.stop()


def _metric(url: str, line_start: str) -> float:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _metric_lines(url: str, word: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as reply:
        return "\n".join(line for line in reply.read().decode().splitlines() if word in line)


def test_data_channel_request_trickled_is_cut_by_the_call_deadline(strict_proxied, rgb_model):
    """A client with no deadline of its own that trickles its request is closed by the daemon's whole-call
    deadline (not a per-read one: every piece comes well within a second of the last); others are served
    meanwhile, and nothing is lost."""
    import socket

    from bpuemu.board.messages import infer_request
    from bpuemu.common.wire import HELLO, HELLO_OK, INFER, pack_frame, read_frame

    d, proxy, data_port, metrics = strict_proxied
    with d.client() as c:
        sha = c.ensure_model(rgb_model.path)
        c.load(sha)
    request = pack_frame(INFER, infer_request(sha, "", [rgb_model.x]).SerializeToString())
    assert len(request) > 3000
    slow = socket.create_connection((proxy.host, data_port), timeout=60)
    slow.sendall(pack_frame(HELLO))
    assert read_frame(slow)[0] == HELLO_OK
    proxy.up_rate = 200  # 10 bytes every 50 ms: the request would take 15 s
    t0 = time.monotonic()
    slow.sendall(request)
    with d.client() as other:  # the daemon serves others meanwhile, over both transports
        for _ in range(3):
            assert other.infer(sha, "", [rgb_model.x]).outputs
        assert other._data is not None
    assert slow.recv(100) == b""  # closed by the daemon: no reply, EOF
    elapsed = time.monotonic() - t0
    slow.close()
    assert 1.5 < elapsed < 2.0 + 4.0, f"the trickling connection was closed after {elapsed:.1f} s (deadline 2 s)"
    proxy.up_rate = 0
    assert wait_until(lambda: _metric(metrics, 'hrt_boardd_calls_total{code="DEADLINE_EXCEEDED",method="Infer",'
                                               'transport="data"}') == 1, timeout=10)
    assert "closed: a call not done within its deadline (--call-deadline 2 s" in d.log()
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def test_data_channel_hello_trickled_is_closed_by_its_deadline(strict_proxied, rgb_model):
    """A connection that trickles its HELLO (a byte every 50 ms, each well within any per-read timeout) is closed
    once the handshake + HELLO deadline has passed in all, not held for as long as it keeps sending; others are
    served meanwhile, over both transports."""
    import socket

    from bpuemu.board.daemon.datachannel import HELLO_TIMEOUT_S
    from bpuemu.common.wire import DATA_HEADER, DATA_MAGIC, HELLO

    d, proxy, data_port, _ = strict_proxied
    proxy.up_rate = 20  # a byte every 50 ms
    slow = socket.create_connection((proxy.host, data_port), timeout=HELLO_TIMEOUT_S + 20)
    t0 = time.monotonic()
    slow.sendall(DATA_HEADER.pack(DATA_MAGIC, HELLO, 4000) + b"t" * 4000)  # a 4000-byte token: 200 s at this rate
    with d.client() as other:  # not through the proxy
        sha = other.ensure_model(rgb_model.path)
        for _ in range(3):
            assert other.infer(sha, "", [rgb_model.x]).outputs
        assert other._data is not None
    try:
        assert slow.recv(100) == b""  # closed by the daemon: no HELLO_OK, no ERROR frame, EOF
    except ConnectionResetError:
        pass  # closed with the trickled bytes unread: a reset, as good
    elapsed = time.monotonic() - t0
    slow.close()
    proxy.up_rate = 0
    assert HELLO_TIMEOUT_S - 1 < elapsed < HELLO_TIMEOUT_S + 4, \
        f"the trickled HELLO was closed after {elapsed:.1f} s (deadline {HELLO_TIMEOUT_S:g} s)"
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)


def test_upload_trickled_is_cut_by_the_call_deadline(strict_proxied, rgb_model, sample_models):
    """An upload that trickles is ended by the daemon's deadline: its slot is free again, no partial file stays,
    and the same model then uploads at full speed."""
    d, proxy, _, metrics = strict_proxied
    model = sample_models["nv12"].path
    proxy.up_rate = 1000  # the 10 KB model would take 10 s; the daemon allows 2 s
    with BoardClient(f"{proxy.host}:{d.port}", data_channel=False) as c:  # the client's own deadline is 30 s
        exc, elapsed = _timed(lambda: c.upload(model))
    assert elapsed < 2.0 + 4.0, f"the trickled upload ended after {elapsed:.1f} s (deadline 2 s)"
    assert isinstance(exc, DeadlineExceeded) and f"{proxy.host}:{d.port}" in str(exc), str(exc)
    proxy.up_rate = 0
    assert wait_until(lambda: not _upload_files(d), timeout=10)
    assert wait_until(lambda: _metric(metrics, 'hrt_boardd_calls_total{code="DEADLINE_EXCEEDED",method="UploadModel",'
                                               'transport="grpc"}') == 1, timeout=30), _metric_lines(metrics, "UploadModel")
    with d.client() as c:
        assert not c.upload(model).already_present  # nothing of the cut upload was kept, its slot is free
    assert_store_clean(d)
    assert_daemon_serves(d, rgb_model.path, rgb_model.x)
