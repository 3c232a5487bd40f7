"""hrt_boardd over gRPC: handshake, health, reflection, the store, errors, auth, jobs.

A real daemon process on a free loopback port, driven by the real BoardClient
and, where a misbehaving client is the point, by the raw generated stub.
After every bad request the daemon must still serve (a good infer succeeds,
bit for bit equal to the local runtime) and its store must hold no partial
file.
"""
import os
import platform
import shutil
import signal
import threading
import time

import grpc
import numpy as np
import onnxruntime
import pytest

from bpuemu.board.backends import LocalBackend, RemoteBackend
from bpuemu.board.runtime.perf_job import PerfConfig
from bpuemu.common.container import file_sha256
from bpuemu.common.errors import (
    BoardUnavailable,
    DeadlineExceeded,
    IncompatibleVersion,
    InvalidInput,
    InvalidModelFile,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
)
from bpuemu.common.proto import board_pb2, board_pb2_grpc
from bpuemu.common.version import API_VERSION, FORMAT_MAJOR, FORMAT_MINOR, __version__
from bpuemu.common.wire import MAX_MESSAGE_BYTES

from boardd_harness import (
    assert_daemon_serves,
    assert_ok,
    assert_one_error,
    assert_store_clean,
    clean_env,
    cpu_seconds,
    damaged_copies,
    run_cli,
    wait_until,
)

SERVICE = "bpuemu.board.v1.Board"
GRPC_CORE_LOG = r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] "


def _stub(channel) -> board_pb2_grpc.BoardStub:
    return board_pb2_grpc.BoardStub(channel)


def _upload_files(store_dir) -> list:
    return [f for f in os.listdir(store_dir) if f.startswith(".upload-")]


# --- handshake, health, reflection ---------------------------------------------

def test_handshake_reports_the_board(board):
    with board.client() as c:
        info = c.handshake()
    assert info.api_version == API_VERSION
    assert info.daemon_version == __version__
    assert info.arch == platform.machine()
    assert info.onnxruntime_version == onnxruntime.__version__
    assert (info.format_major, info.format_minor) == (FORMAT_MAJOR, FORMAT_MINOR)
    assert info.cpu_count >= 1


def test_handshake_refuses_another_api_major(board, rgb_model):
    with board.channel() as channel:
        with pytest.raises(grpc.RpcError) as err:
            _stub(channel).Handshake(board_pb2.HandshakeRequest(api_version=99, client_version="9.0.0"), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.value.details()
    assert "v99" in details and f"v{API_VERSION}" in details, details
    assert "9.0.0" in details and __version__ in details, details
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


def test_health_reports_serving(board):
    assert board.health("") == "SERVING"
    assert board.health(SERVICE) == "SERVING"


def test_reflection_lists_the_board_service(board):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with board.channel() as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = db.get_services()
        assert SERVICE in services
        assert "grpc.health.v1.Health" in services
        methods = {m.name for m in db.FindFileContainingSymbol(SERVICE).service[0].method}
    assert {"Handshake", "UploadModel", "Infer", "Perf"} <= methods


# --- the same numbers, in-process and on the board -------------------------------

@pytest.mark.parametrize("kind", ["rgb", "nv12", "featuremap"])
def test_remote_backend_matches_local_bit_for_bit(board, sample_models, kind):
    model = sample_models[kind]
    with LocalBackend([model.path]) as local, RemoteBackend(board.target, [model.path]) as remote:
        assert remote.model_names == local.model_names == [model.name]
        assert remote.model().model == local.model().model  # same tensor properties, same plan
        want = local.model().infer([model.x], dump_intermediate=True)
        got = remote.model().infer([model.x], dump_intermediate=True)
    assert list(got.outputs) == list(want.outputs) == ["prob"]
    for name, array in want.outputs.items():
        assert got.outputs[name].dtype == array.dtype and np.array_equal(got.outputs[name], array), name
    assert want.intermediates and sorted(got.intermediates) == sorted(want.intermediates)
    for name, array in want.intermediates.items():
        assert np.array_equal(got.intermediates[name], array), name

    with board.client() as c:  # the client API directly, several frames
        sha = c.ensure_model(model.path)
        assert sha == model.sha256
        result = c.infer(sha, model.name, [model.x], frame_count=3)
    assert len(result.latency_ms) == 3 and all(t > 0 for t in result.latency_ms)
    assert np.array_equal(result.outputs["prob"], want.outputs["prob"])


def test_different_inputs_give_different_outputs(board, rgb_model):
    """Guards the bit-exact tests above against a board that ignores its input."""
    with board.client() as c:
        sha = c.ensure_model(rgb_model.path)
        a = c.infer(sha, "", [rgb_model.x]).outputs["prob"]
        b = c.infer(sha, "", [255 - rgb_model.x]).outputs["prob"]
    assert not np.array_equal(a, b)


# --- the store: content-addressed, never partial ---------------------------------

def test_upload_once_then_found_by_sha(board, tmp_path):
    from bpuemu.host.samples import sample_bin

    path = str(tmp_path / "once.bin")
    sha = sample_bin(path, input_type_rt="featuremap", height=32, width=32, seed=21)
    with board.client() as c:
        assert not c.has_model(sha).present
        first = c.upload(path)
        assert (first.sha256, first.already_present, first.bytes_received) == (sha, False, os.path.getsize(path))
        stat = os.stat(os.path.join(board.model_dir, f"{sha}.bin"))
        second = c.upload(path)
        assert second.already_present and second.bytes_received == 0
        assert c.ensure_model(path) == sha
        assert c.has_model(sha).present and not c.has_model(sha).loaded
        assert c.load(sha) == ["sample_32x32_featuremap"]
        assert c.has_model(sha).loaded
        listed = {m.sha256: m for m in c.list_models()}
        assert listed[sha].loaded and list(listed[sha].model_names) == ["sample_32x32_featuremap"]
        assert c.unload(sha) and not c.unload(sha)
    again = os.stat(os.path.join(board.model_dir, f"{sha}.bin"))
    assert (again.st_ino, again.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    with open(os.path.join(board.model_dir, f"{sha}.bin"), "rb") as stored, open(path, "rb") as original:
        assert stored.read() == original.read()
    assert_store_clean(board)


@pytest.mark.parametrize("kind, error, status, words", [
    ("corrupt", (InvalidInput, InvalidModelFile), "INVALID_ARGUMENT", ["corrupt", "checksum mismatch"]),
    ("truncated", (InvalidInput, InvalidModelFile), "INVALID_ARGUMENT", ["truncated"]),
    ("wrong_magic", (InvalidInput, InvalidModelFile), "INVALID_ARGUMENT", ["magic"]),
    ("newer_major", IncompatibleVersion, "FAILED_PRECONDITION", ["format 99.", "newer"]),
])
def test_damaged_model_upload_is_refused(board, rgb_model, tmp_path, kind, error, status, words):
    path = damaged_copies(rgb_model.path, tmp_path)[kind]
    sha = file_sha256(path)
    with board.client() as c:
        with pytest.raises(error) as exc:
            c.upload(path)
        assert exc.value.grpc_status == status
        for word in words:
            assert word in exc.value.message, exc.value.message
        assert not c.has_model(sha).present
    # The raw status, as any gRPC client sees it.
    with board.channel() as channel, open(path, "rb") as f:
        chunks = [board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=sha, size=os.path.getsize(path), file_name="x.bin")),
                  board_pb2.UploadChunk(data=f.read())]
        with pytest.raises(grpc.RpcError) as err:
            _stub(channel).UploadModel(iter(chunks), timeout=10)
    assert err.value.code().name == status
    assert f"{sha}.bin" not in board.store_files()
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


def test_upload_with_wrong_sha_is_refused_and_not_published(board, rgb_model):
    with open(rgb_model.path, "rb") as f:
        data = f.read()
    claimed = "ab" * 32
    chunks = [board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=claimed, size=len(data), file_name="liar.bin")),
              board_pb2.UploadChunk(data=data[: len(data) // 2]), board_pb2.UploadChunk(data=data[len(data) // 2:])]
    with board.channel() as channel:
        with pytest.raises(grpc.RpcError) as err:
            _stub(channel).UploadModel(iter(chunks), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not match" in err.value.details() and "upload corrupt" in err.value.details()
    assert not any(f.startswith(claimed) for f in board.store_files())
    with board.client() as c:
        assert not c.has_model(claimed).present
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


@pytest.mark.parametrize("how", ["cancel", "close_channel"])
def test_client_gone_mid_upload_leaves_no_partial_file(board, rgb_model, how):
    with open(rgb_model.path, "rb") as f:
        data = f.read()
    fake_sha = "cd" * 32 if how == "cancel" else "ef" * 32  # a model the board does not have
    release = threading.Event()

    def chunks():
        yield board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=fake_sha, size=len(data) * 4, file_name="gone.bin"))
        yield board_pb2.UploadChunk(data=data)
        release.wait(30)  # the client "hangs" mid-upload until the test is done

    channel = board.channel()
    try:
        future = _stub(channel).UploadModel.future(chunks(), timeout=30)
        # The daemon has begun the upload: its temporary file exists.
        assert wait_until(lambda: _upload_files(board.model_dir), timeout=10), "the upload never started"
        if how == "cancel":
            assert future.cancel()
        else:
            channel.close()
    finally:
        release.set()
        channel.close()
    assert wait_until(lambda: not _upload_files(board.model_dir), timeout=10), _upload_files(board.model_dir)
    assert not any(f.startswith(fake_sha) for f in board.store_files())
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


# --- errors as gRPC statuses -------------------------------------------------------

def test_unknown_model_is_not_found(board, rgb_model):
    unknown = "0" * 64
    with board.client() as c:
        assert not c.has_model(unknown).present
        for call in (lambda: c.load(unknown), lambda: c.model_info(unknown),
                     lambda: c.infer(unknown, "", [rgb_model.x]),
                     lambda: c.perf(unknown, "", PerfConfig(frame_count=1))):
            with pytest.raises(NotFound) as exc:
                call()
            assert exc.value.grpc_status == "NOT_FOUND"
            assert "000000000000" in exc.value.message and "not on this board" in exc.value.message
        sha = c.ensure_model(rgb_model.path)
        with pytest.raises(NotFound, match="'nope' is not in"):
            c.model_info(sha, "nope")
        with pytest.raises(NotFound, match="'nope'"):
            c.infer(sha, "nope", [rgb_model.x])
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


@pytest.mark.parametrize("bad_sha", ["../../etc/passwd", "../outside", "0" * 63 + "/", "A" * 64])
def test_path_traversal_sha_is_refused(board, rgb_model, bad_sha):
    # A valid model right where "../outside" would lead: a daemon that built
    # paths from raw ids would happily find and load it.
    shutil.copy(rgb_model.path, os.path.join(board.workdir, "outside.bin"))
    with board.channel() as channel:
        stub = _stub(channel)
        ref = board_pb2.ModelRef(sha256=bad_sha)
        calls = [
            lambda: stub.HasModel(ref, timeout=10),
            lambda: stub.LoadModel(ref, timeout=10),
            lambda: stub.UnloadModel(ref, timeout=10),
            lambda: stub.GetModelInfo(board_pb2.ModelInfoRequest(sha256=bad_sha), timeout=10),
            lambda: stub.Infer(board_pb2.InferRequest(sha256=bad_sha), timeout=10),
            lambda: list(stub.Perf(board_pb2.PerfRequest(sha256=bad_sha, frame_count=1, thread_num=1), timeout=10)),
            lambda: stub.UploadModel(iter([board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=bad_sha, size=10)),
                                           board_pb2.UploadChunk(data=b"0123456789")]), timeout=10),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
            assert "is not a model id" in err.value.details()
    with board.client() as c:
        with pytest.raises(InvalidInput, match="not a model id"):
            c.has_model(bad_sha)
    assert not os.path.exists(os.path.join(board.workdir, "outside.json"))
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


def test_upload_must_start_with_a_header(board, rgb_model):
    with board.channel() as channel:
        with pytest.raises(grpc.RpcError) as err:
            _stub(channel).UploadModel(iter([board_pb2.UploadChunk(data=b"x")]), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UploadHeader" in err.value.details()
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


def test_message_over_the_size_limit_is_resource_exhausted(board, rgb_model):
    """A single message over MAX_MESSAGE_BYTES: the daemon refuses it and carries on."""
    with board.client() as c:
        sha = c.ensure_model(rgb_model.path)
    req = board_pb2.InferRequest(sha256=sha)
    req.inputs.add(name="data", dtype="uint8", shape=[MAX_MESSAGE_BYTES + 1], data=bytes(MAX_MESSAGE_BYTES + 1))
    # This client lifts its own send limit so that the daemon's limit is what is tested.
    with board.channel(**{"grpc.max_send_message_length": -1}) as channel:
        with pytest.raises(grpc.RpcError) as err:
            _stub(channel).Infer(req, timeout=60)
    del req
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
    assert "larger than max" in err.value.details()
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


def test_model_over_max_model_mb_is_refused(start_daemon, rgb_model, scratch, tmp_path):
    daemon = start_daemon("--max-model-mb", "1")
    big = tmp_path / "big.bin"
    with open(rgb_model.path, "rb") as f:
        big.write_bytes(f.read() + bytes((1 << 20) + 1))  # a model padded past 1 MiB
    with daemon.client() as c:
        with pytest.raises(ResourceExhausted) as exc:
            c.upload(str(big))
    assert exc.value.grpc_status == "RESOURCE_EXHAUSTED"
    assert f"limit of {1 << 20} bytes" in exc.value.message
    line = assert_one_error(run_cli(["model_info", "--model_file", big, "--board", daemon.target], scratch),
                            "over this board's limit", exit_code=1)
    assert daemon.target in line
    assert not _upload_files(daemon.model_dir) and daemon.store_files() == []
    assert_daemon_serves(daemon, rgb_model.path, rgb_model.x)


# --- jobs: perf streams, is cancelled by its caller, frees its slot ------------------

def test_perf_over_the_api(board, rgb_model):
    with board.client() as c:
        sha = c.ensure_model(rgb_model.path)
        report = c.perf(sha, "", PerfConfig(frame_count=30, thread_num=2, profile=True))
    assert (report.frame_count, report.thread_num, report.model_name) == (30, 2, rgb_model.name)
    assert report.fps > 0 and 0 < report.p50_ms <= report.p99_ms
    assert report.profiler_log.count("***") == 1 and report.profiler_csv.startswith("name,processor,count")


def test_perf_streams_progress(board, rgb_model):
    seen = []
    with board.client() as c:
        sha = c.ensure_model(rgb_model.path)
        report = c.perf(sha, "", PerfConfig(perf_time_minutes=0.01),  # 0.6 s: several progress intervals
                        progress=lambda done, total, elapsed: seen.append((done, total, elapsed)))
    assert len(seen) >= 2, seen
    assert all(total == 0 for _, total, _ in seen)  # time-bound: no frame total
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen) and seen[-1][0] > 0
    assert [e for _, _, e in seen] == sorted(e for _, _, e in seen)
    assert report.frame_count >= seen[-1][0]


def test_perf_cancelled_by_deadline_frees_its_job_slot(start_daemon, rgb_model):
    daemon = start_daemon("--max-jobs", "1")
    outcome = {}
    running = threading.Event()

    with daemon.client() as c:
        sha = c.ensure_model(rgb_model.path)

        def long_perf():
            try:
                c.perf(sha, "", PerfConfig(perf_time_minutes=1.0, thread_num=2), progress=lambda *a: running.set(),
                       timeout=1.5)
            except BaseException as exc:  # noqa: BLE001 - inspected below
                outcome["error"] = exc

        t0 = time.monotonic()
        worker = threading.Thread(target=long_perf)
        worker.start()
        assert running.wait(10), "the perf job never reported progress"
        # The one job slot is taken: a second job is refused while the first runs.
        with pytest.raises(ResourceExhausted, match="busy"):
            c.perf(sha, "", PerfConfig(frame_count=1))
        worker.join(30)
        assert not worker.is_alive()
        assert isinstance(outcome.get("error"), DeadlineExceeded), outcome
        assert time.monotonic() - t0 < 10

        # The daemon noticed the caller left: the slot comes back within a few seconds.
        deadline = time.monotonic() + 5
        while True:
            try:
                report = c.perf(sha, "", PerfConfig(frame_count=5))
                break
            except ResourceExhausted:
                assert time.monotonic() < deadline, "the cancelled perf job kept its slot"
                time.sleep(0.1)
        assert report.frame_count == 5

    # And the cancelled job really stopped: the board idles instead of running frames for a minute.
    before = cpu_seconds(daemon.proc.pid)
    time.sleep(1.0)
    assert cpu_seconds(daemon.proc.pid) - before < 0.3, "the cancelled perf job is still running"
    assert_daemon_serves(daemon, rgb_model.path, rgb_model.x)


def test_sigterm_lets_a_running_perf_finish(start_daemon, rgb_model):
    daemon = start_daemon()
    running = threading.Event()
    outcome = {}
    with daemon.client() as c:
        sha = c.ensure_model(rgb_model.path)

        def perf():
            try:
                outcome["report"] = c.perf(sha, "", PerfConfig(perf_time_minutes=0.02), progress=lambda *a: running.set())
            except BaseException as exc:  # noqa: BLE001 - inspected below
                outcome["error"] = exc

        worker = threading.Thread(target=perf)
        worker.start()
        assert running.wait(10)
        daemon.proc.send_signal(signal.SIGTERM)
        worker.join(30)
    assert "error" not in outcome, outcome
    assert outcome["report"].frame_count > 0 and outcome["report"].run_time_ms >= 0.02 * 60e3
    assert daemon.proc.wait(20) == 0
    assert "shutting down" in daemon.log() and "Traceback" not in daemon.log()


def test_sigterm_during_a_perf_longer_than_the_grace_still_exits_cleanly(start_daemon, rgb_model):
    """The daemon's 5 s grace runs out: it cancels the perf and still exits 0 (no abort)."""
    daemon = start_daemon()
    running = threading.Event()
    outcome = {}
    with daemon.client() as c:
        sha = c.ensure_model(rgb_model.path)

        def perf():
            try:
                c.perf(sha, "", PerfConfig(perf_time_minutes=1.0, thread_num=2), progress=lambda *a: running.set())
            except BaseException as exc:  # noqa: BLE001 - inspected below
                outcome["error"] = exc

        worker = threading.Thread(target=perf)
        worker.start()
        assert running.wait(10)
        t0 = time.monotonic()
        daemon.proc.send_signal(signal.SIGTERM)
        code = daemon.proc.wait(30)
        worker.join(30)
    assert code == 0, f"hrt_boardd exited {code}:\n{daemon.log()}"
    assert time.monotonic() - t0 < 15
    assert isinstance(outcome.get("error"), BoardUnavailable), outcome
    assert daemon.target in outcome["error"].message
    assert "Traceback" not in daemon.log() and "terminate called" not in daemon.log()


def test_perf_arguments_over_limits_are_invalid(start_daemon, rgb_model):
    daemon = start_daemon("--max-frame-count", "10", "--max-perf-time", "0.01")
    with daemon.client() as c:
        sha = c.ensure_model(rgb_model.path)
        with pytest.raises(InvalidInput, match="frame_count 11 is over this board's limit of 10"):
            c.perf(sha, "", PerfConfig(frame_count=11))
        with pytest.raises(InvalidInput, match="perf_time 1.0 min is over"):
            c.perf(sha, "", PerfConfig(perf_time_minutes=1.0))
        with pytest.raises(InvalidInput, match="thread_num"):
            c.perf(sha, "", PerfConfig(frame_count=1, thread_num=9))
        with pytest.raises(InvalidInput, match="frame_count 11"):
            c.infer(sha, "", [rgb_model.x], frame_count=11)
        assert c.perf(sha, "", PerfConfig(frame_count=10)).frame_count == 10
    assert_daemon_serves(daemon, rgb_model.path, rgb_model.x)


# --- authentication ------------------------------------------------------------------

def test_token_auth(start_daemon, rgb_model, token_file, scratch, tmp_path):
    daemon = start_daemon("--token-file", str(token_file))
    token = token_file.read_text().strip()
    wrong_file = tmp_path / "wrong.token"
    wrong_file.write_text("not-the-token-of-this-board-000\n")
    args = ["infer", "--model_file", rgb_model.path, "--board", daemon.target]

    line = assert_one_error(run_cli(args, scratch), "no token", exit_code=1)
    assert daemon.target in line
    assert_one_error(run_cli(args + ["--token-file", wrong_file], scratch), "wrong token", exit_code=1)
    assert_one_error(run_cli(args, scratch, env=clean_env(BPUEMU_TOKEN="also-wrong-token-0000")), "wrong token", exit_code=1)
    assert daemon.store_files() == []  # nothing got through

    ok = run_cli(args + ["--token-file", token_file], scratch)
    assert_ok(ok)
    assert "infer success" in ok.stdout
    assert_ok(run_cli(["model_info", "--model_file", rgb_model.path, "--board", daemon.target], scratch,
                      env=clean_env(BPUEMU_TOKEN=token)))

    with daemon.client() as c:
        with pytest.raises(Unauthenticated) as exc:
            c.handshake()
        assert exc.value.grpc_status == "UNAUTHENTICATED"
    with daemon.client(token="x" * 32) as c:
        with pytest.raises(Unauthenticated, match="wrong token"):
            c.list_models()
    assert daemon.health() == "SERVING"  # probes need no token
    assert_daemon_serves(daemon, rgb_model.path, rgb_model.x, token=token)


def _run_daemon_expecting_failure(tmp_path, *args):
    # A daemon that wrongly starts serves until killed: the timeout turns that into a failure.
    return run_cli(["--model-dir", tmp_path / "models", *args], tmp_path, module="bpuemu.board.daemon", timeout=30)


def test_listening_beyond_loopback_needs_a_token(tmp_path):
    result = _run_daemon_expecting_failure(tmp_path, "--listen", "0.0.0.0:0")
    line = assert_one_error(result, "refusing to listen on 0.0.0.0", "without authentication", exit_code=1)
    assert "--token-file" in result.stderr
    assert "listening on" not in result.output, line


def test_short_token_file_refuses_to_start(tmp_path):
    short = tmp_path / "short.token"
    short.write_text("abc\n")
    result = _run_daemon_expecting_failure(tmp_path, "--listen", "127.0.0.1:0", "--token-file", short)
    assert_one_error(result, "too short", str(short), exit_code=1)
    assert "listening on" not in result.output


def test_daemon_refuses_a_port_in_use(board, tmp_path):
    """gRPC's default SO_REUSEPORT would let a second daemon share the port: it must refuse."""
    result = _run_daemon_expecting_failure(tmp_path, "--listen", board.target)
    # gRPC's C core logs the failed bind itself (one "E.... add_port.cc" line); that is its own log, not ours.
    assert_one_error(result, "cannot listen on", board.target, exit_code=1, ignore=GRPC_CORE_LOG)
    assert board.health() == "SERVING"


@pytest.mark.parametrize("call", ["perf", "upload"])
def test_a_cancelled_call_is_freed_when_it_ends(tmp_path, rgb_model, call):
    """A cancelled perf or upload call's gRPC context goes when the call ends, not at some later gc pass: reference
    cycles (through the perf job's error; through the error gRPC keeps when an upload's stream is cut) kept each
    one, with its native call, alive, and a soak's RSS crept with every cancel. In-process (the real server and
    gRPC), with the cycle collector off so that only a cycle keeps a context."""
    import gc
    import hashlib

    from grpc import _server as grpc_server

    from bpuemu.board.daemon.server import BoardServer

    sha = file_sha256(rgb_model.path)
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(rgb_model.path, models / f"{sha}.bin")
    data = open(rgb_model.path, "rb").read()

    def contexts() -> int:
        return sum(isinstance(o, grpc_server._Context) for o in gc.get_objects())

    def cancelled_call(stub, i: int) -> None:
        if call == "perf":
            stream = stub.Perf(board_pb2.PerfRequest(sha256=sha, thread_num=1, perf_time_minutes=0.05), timeout=30)
            next(iter(stream))  # the job runs
            stream.cancel()
            return
        sent = threading.Event()
        other = hashlib.sha256(b"%d" % i).hexdigest()

        def chunks():  # half an upload, then the caller goes
            yield board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=other, size=len(data), file_name="x.bin"))
            yield board_pb2.UploadChunk(data=data[: len(data) // 2])
            sent.set()
            time.sleep(2)

        future = stub.UploadModel.future(chunks(), timeout=30)
        assert sent.wait(10)
        time.sleep(0.2)
        future.cancel()

    with BoardServer("127.0.0.1:0", str(models), data_channel=False) as server, \
            grpc.insecure_channel(server.target) as channel:
        stub = board_pb2_grpc.BoardStub(channel)
        gc.collect()
        gc.disable()
        try:
            before = contexts()
            for i in range(4):
                cancelled_call(stub, i)
            assert wait_until(lambda: server.state.jobs_running == 0, timeout=20)
            assert wait_until(lambda: contexts() <= before, timeout=10), \
                f"{contexts() - before} gRPC contexts of cancelled {call} calls still alive"
        finally:
            gc.enable()
        assert sorted(os.listdir(models)) == [f"{sha}.bin"]  # no partial upload left
