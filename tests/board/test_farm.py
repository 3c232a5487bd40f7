"""A board farm: three real hrt_boardd daemons on different loopback ports, driven as one.

perf fans out (a block per board, a table, the aggregate); a board killed and
restarted mid-job is reported as that board's failure while the others'
results are kept; infer is spread by gRPC's round_robin over all boards
(checked with each board's own GetStats counters); many items mapped over the
boards survive a board SIGKILLed mid-run. One FarmClient API throughout: the
CLI's and the library's.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from bpuemu.board.backends import LocalBackend
from bpuemu.board.farm import BoardAccess, FarmClient, map_with_failover, parse_boards
from bpuemu.board.runtime.perf_job import PerfConfig
from bpuemu.board.security import TlsConfig
from bpuemu.common.errors import BoardUnavailable, Cancelled, InvalidInput

from boardd_harness import Daemon, assert_ok, assert_one_error, clean_env, run_cli, wait_until

N_BOARDS = 3
TABLE_ROW = re.compile(r"^(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """Three daemons, each with its own model store, on three free loopback ports."""
    daemons = [Daemon(tmp_path_factory.mktemp(f"farm_board{i}")) for i in range(N_BOARDS)]
    try:
        for d in daemons:
            d.start()
        assert len({d.port for d in daemons}) == N_BOARDS
        yield daemons
    finally:
        for d in daemons:
            d.stop()


def _targets(daemons):
    return [d.target for d in daemons]


def _stats(daemons):
    out = {}
    for d in daemons:
        with d.client() as c:
            out[d.target] = c.stats()
    return out


def _table(stdout: str) -> dict:
    """board -> (frames, fps, avg, p50, p90, p99) from the farm perf table; "all boards" too."""
    rows = {}
    for line in stdout.splitlines():
        line = line.replace("all boards", "all_boards")
        m = TABLE_ROW.match(line.strip())
        if m:
            rows[m.group(1)] = (int(m.group(2)),) + tuple(float(v) for v in m.group(3, 4, 5, 6, 7))
    return rows


# --- board lists -----------------------------------------------------------------------

def test_parse_boards_from_a_list_and_a_file(tmp_path):
    assert parse_boards("10.0.0.1:9473, 10.0.0.2:9474") == ["10.0.0.1:9473", "10.0.0.2:9474"]
    assert parse_boards("board-a") == ["board-a:9473"]  # the default port
    assert parse_boards("[::1]:5,127.0.0.1:6") == ["[::1]:5", "127.0.0.1:6"]
    listing = tmp_path / "boards.txt"
    listing.write_text("# the lab's boards\n10.0.0.1:9473\n\n  10.0.0.2:9473   # rack 2\n10.0.0.3\n")
    assert parse_boards(f"@{listing}") == ["10.0.0.1:9473", "10.0.0.2:9473", "10.0.0.3:9473"]
    assert parse_boards(f"@{listing},10.0.0.9:1") == ["10.0.0.1:9473", "10.0.0.2:9473", "10.0.0.3:9473", "10.0.0.9:1"]
    assert parse_boards("") == []


@pytest.mark.parametrize("spec, message", [
    ("10.0.0.1:9473,10.0.0.1:9473", "listed twice"),
    ("10.0.0.1:x", "port 'x' is not a number"),
    ("@/nonexistent/boards.txt", "cannot read board list"),
    ("@EMPTY", "names no board"),
])
def test_bad_board_lists_are_one_clear_error(tmp_path, spec, message):
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n\n")
    with pytest.raises(InvalidInput, match=re.escape(message)):
        parse_boards(spec.replace("EMPTY", str(empty)))


def test_cli_bad_board_list_is_one_error_line(scratch, rgb_model):
    result = run_cli(["perf", "--model_file", rgb_model.path, "--board", "127.0.0.1:1,127.0.0.1:1"], scratch)
    assert_one_error(result, "listed twice", exit_code=1)


# --- perf on every board ------------------------------------------------------------------

def test_perf_fans_out_to_every_board_with_a_table_and_the_aggregate(farm, rgb_model, scratch, tmp_path):
    listing = tmp_path / "boards.txt"
    listing.write_text("# three boards\n" + "\n".join(_targets(farm)) + "\n")
    before = _stats(farm)
    result = run_cli(["perf", "--model_file", rgb_model.path, "--board", f"@{listing}", "--frame_count", "40",
                      "--thread_num", "2", "--profile_path", "prof"], scratch)
    assert_ok(result)
    out = result.stdout
    for d in farm:  # the seed's block for each board
        assert f"=== board {d.target} (" in out
    blocks = re.split(r"^=== board ", out, flags=re.M)[1:]
    assert len(blocks) == N_BOARDS
    for block in blocks:
        assert "Frame count   is: 40" in block and "Thread number is: 2" in block and "FPS" in block
    assert f"Board farm perf: {N_BOARDS} boards, {N_BOARDS} succeeded, 0 failed" in out
    rows = _table(out)
    assert set(rows) == set(_targets(farm)) | {"all_boards"}, rows
    per_board = [rows[t] for t in _targets(farm)]
    assert all(r[0] == 40 and r[1] > 0 for r in per_board)
    total = rows["all_boards"]
    assert total[0] == 40 * N_BOARDS
    assert total[1] == pytest.approx(sum(r[1] for r in per_board), rel=1e-3, abs=0.01)  # FPS: the sum
    assert total[5] == pytest.approx(max(r[5] for r in per_board), abs=0.001)  # p99: the worst board's
    # Each board really ran its own job, and wrote its own profile.
    after = _stats(farm)
    assert all(after[t].perf_jobs == before[t].perf_jobs + 1 for t in _targets(farm))
    for t in _targets(farm):
        log = scratch / "prof" / t.replace(":", "_") / "profiler.log"
        assert log.is_file() and log.read_text().count("***") == 1, log


def test_perf_through_the_library(farm, rgb_model, tmp_path):
    with FarmClient(_targets(farm), [rgb_model.path]) as client:
        run = client.perf("", PerfConfig(frame_count=10, profile=True), profile_path=str(tmp_path / "prof"))
    assert [o.target for o in run.outcomes] == _targets(farm) and all(o.ok for o in run.outcomes)
    s = run.summary
    assert (s.boards, s.succeeded, s.frame_count) == (N_BOARDS, N_BOARDS, 30)
    assert s.fps == pytest.approx(sum(o.value.report.fps for o in run.outcomes))
    run.raise_if_failed()
    for o in run.outcomes:  # the library writes each board's profile, in a directory of its own
        assert o.value.profile_files == ["profiler.log", "profiler.csv"]
        assert o.value.directory == str(tmp_path / "prof" / o.target.replace(":", "_"))
        assert (tmp_path / "prof" / o.target.replace(":", "_") / "profiler.log").read_text() == o.value.report.profiler_log


def test_one_board_is_the_same_call(farm, rgb_model, tmp_path):
    """A backend of one board answers the same calls, its files in the directory given (no per-board one)."""
    from bpuemu.board.connect import open_backend

    with open_backend([rgb_model.path], board=[farm[0].target]) as be:
        run = be.perf("", PerfConfig(frame_count=5, profile=True), profile_path=str(tmp_path))
        infer = be.infer("", [rgb_model.x])
    assert [o.target for o in run.outcomes] == [farm[0].target] and run.summary.frame_count == 5
    assert (tmp_path / "profiler.log").is_file()
    assert infer.agreement is None and infer.ok[0].value.directory == "."


def test_farm_perf_is_cancelled_on_every_board(farm, rgb_model):
    cancel = threading.Event()

    def cancel_when_all_run():
        if wait_until(lambda: all(s.jobs_running == 1 for s in _stats(farm).values()), timeout=30):
            cancel.set()

    watcher = threading.Thread(target=cancel_when_all_run)
    with FarmClient(_targets(farm), [rgb_model.path]) as client:
        t0 = time.monotonic()
        watcher.start()
        run = client.perf("", PerfConfig(perf_time_minutes=1.0), cancel=cancel)
        watcher.join()
    assert cancel.is_set() and time.monotonic() - t0 < 20
    assert all(isinstance(o.error, Cancelled) for o in run.outcomes), run.outcomes
    assert wait_until(lambda: all(s.jobs_running == 0 for s in _stats(farm).values()), timeout=5)


def test_ctrl_c_stops_the_jobs_on_every_board(farm, rgb_model, scratch):
    args = [sys.executable, "-m", "bpuemu.board.cli.hrt_model_exec", "perf", "--model_file", rgb_model.path,
            "--board", ",".join(_targets(farm)), "--perf_time", "1"]
    cli = subprocess.Popen(args, cwd=scratch, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: all(s.jobs_running == 1 for s in _stats(farm).values()), timeout=30)
        cli.send_signal(signal.SIGINT)
        stdout, stderr = cli.communicate(timeout=20)  # not the minute the jobs would run
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 130 and "Aborted." in stderr and "Traceback" not in stderr, stderr
    assert wait_until(lambda: all(s.jobs_running == 0 for s in _stats(farm).values()), timeout=5)


def test_a_board_restarted_mid_job_fails_alone(tmp_path_factory, rgb_model, scratch):
    daemons = [Daemon(tmp_path_factory.mktemp(f"restart_board{i}")).start() for i in range(N_BOARDS)]
    victim = daemons[1]
    cli = None
    try:
        args = [sys.executable, "-m", "bpuemu.board.cli.hrt_model_exec", "perf", "--model_file", rgb_model.path,
                "--board", ",".join(_targets(daemons)), "--perf_time", "0.06"]  # 3.6 s on each board
        cli = subprocess.Popen(args, cwd=scratch, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        # Every board is running its job ...
        assert wait_until(lambda: all(s.jobs_running == 1 for s in _stats(daemons).values()), timeout=30), \
            "the perf jobs did not start on every board"
        # ... when one board is killed and comes back on the same port.
        port = victim.port
        victim.kill()
        restarted = Daemon(victim.workdir, "--listen", f"127.0.0.1:{port}").start()
        daemons[1] = restarted
        stdout, stderr = cli.communicate(timeout=60)
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait()
        for d in daemons:
            d.stop()
        victim.kill()
    assert cli.returncode == 1, stdout + stderr
    assert "Traceback" not in stdout + stderr
    lost, kept = victim.target, [daemons[0].target, daemons[2].target]
    # The failure: one line, naming that board only.
    error_lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(error_lines) == 1 and error_lines[0].startswith("ERROR perf failed on 1 of 3 boards"), stderr
    assert lost in error_lines[0] and not any(t in error_lines[0] for t in kept)
    # The others' results are kept: their blocks and rows, and an aggregate of the two.
    assert f"=== board {lost} " not in stdout
    rows = _table(stdout)
    assert set(rows) == set(kept) | {"all_boards"}, stdout
    assert all(rows[t][0] > 0 and rows[t][1] > 0 for t in kept)
    assert rows["all_boards"][0] == sum(rows[t][0] for t in kept)
    assert re.search(rf"^{re.escape(lost)}\s+FAILED\s+\S", stdout, flags=re.M), stdout
    assert "3 boards, 2 succeeded, 1 failed" in stdout
    # The restarted board serves again, with the model it stored before.
    assert restarted.proc.returncode == 0
    assert any(f.endswith(".bin") for f in os.listdir(restarted.model_dir))


# --- infer spread by gRPC round_robin ---------------------------------------------------------

def test_round_robin_spreads_infer_over_every_board(farm, sample_models):
    model = sample_models["nv12"]
    expected = LocalBackend([model.path]).model().infer([model.x]).outputs
    calls = 30
    before = _stats(farm)
    with FarmClient(_targets(farm), [model.path]) as client:
        handle = client.model()
        assert handle.sha == model.sha256
        for d in farm:  # every board holds and has loaded the model
            with d.client() as c:
                assert c.has_model(handle.sha).loaded
        for _ in range(calls):
            got = handle.infer([model.x]).outputs
            assert np.array_equal(got["prob"], expected["prob"])
        assert client.balanced._data is None  # gRPC only: the data channel cannot be balanced
        after = client.stats()
    served = {t: after[t].infer_calls - before[t].infer_calls for t in _targets(farm)}
    assert sum(served.values()) == calls, served
    assert all(n >= calls // N_BOARDS - 3 for n in served.values()), served  # round robin: ~10 each


def test_round_robin_carries_on_when_a_board_goes_down(tmp_path_factory, rgb_model):
    daemons = [Daemon(tmp_path_factory.mktemp(f"rr_board{i}")).start() for i in range(N_BOARDS)]
    try:
        with FarmClient(_targets(daemons), [rgb_model.path]) as client:
            handle = client.model()
            for _ in range(6):
                handle.infer([rgb_model.x])
            daemons[2].kill()
            survivors = daemons[:2]
            before = _stats(survivors)
            # gRPC notices the lost connection; after that every call goes to the boards left.
            ok = 0
            for _ in range(20):
                try:
                    handle.infer([rgb_model.x])
                    ok += 1
                except BoardUnavailable:
                    pass  # at most the call in flight when the board went away
            assert ok >= 19
            after = _stats(survivors)
            assert sum(after[t].infer_calls - before[t].infer_calls for t in _targets(survivors)) == ok
            assert all(after[t].infer_calls > before[t].infer_calls for t in _targets(survivors))
    finally:
        for d in daemons:
            d.stop()


def test_round_robin_over_tls_boards(start_daemon, pki, rgb_model):
    tls = TlsConfig(ca_file=pki.ca)
    daemons = [start_daemon("--tls-cert", pki.server_cert, "--tls-key", pki.server_key, tls=tls) for _ in range(2)]
    with FarmClient(_targets(daemons), [rgb_model.path], BoardAccess(tls=tls)) as client:
        # round_robin sends to the boards whose TLS connection is up: on a loaded machine the second
        # handshake can finish after the first calls, so send in rounds until both have served some.
        for _ in range(25):
            for _ in range(8):
                client.model().infer([rgb_model.x])
            stats = client.stats()
            if all(s.infer_calls >= 2 for s in stats.values()):
                break
    assert all(s.infer_calls >= 2 for s in stats.values()), stats
    with FarmClient(_targets(daemons), [rgb_model.path], BoardAccess(tls=TlsConfig(ca_file=pki.other_ca))) as client:
        with pytest.raises(BoardUnavailable, match="TLS"):
            client.model()


def _free_target() -> str:
    """HOST:PORT where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_board_that_cannot_be_opened_fails_alone(farm, rgb_model):
    down_target = _free_target()
    with FarmClient(_targets(farm)[:2] + [down_target], [rgb_model.path]) as client:
        run = client.model_info()
        handle = client.model()  # the round-robin handle: over the boards that opened
        assert handle.infer([rgb_model.x]).outputs
    assert [o.target for o in run.failed] == [down_target]
    assert all(o.value.handles[0].name == "sample_32x32_rgb" for o in run.ok)
    with pytest.raises(BoardUnavailable) as exc:
        run.raise_if_failed()
    assert "model_info failed on 1 of 3 boards" in exc.value.message and down_target in exc.value.message
    assert not any(t in exc.value.message for t in _targets(farm)[:2])


def test_a_farm_with_no_board_up_says_why_for_each(rgb_model):
    down = [_free_target(), _free_target()]
    with FarmClient(down, [rgb_model.path]) as client:
        with pytest.raises(BoardUnavailable) as exc:
            next(client.map(lambda h, item: item, range(3)))
    assert "opening the farm failed on 2 of 2 boards" in exc.value.message
    assert all(t in exc.value.message for t in down)


def test_infer_agreement_is_checked_bit_for_bit(farm, rgb_model):
    with FarmClient(_targets(farm), [rgb_model.path]) as client:
        run = client.infer("", [rgb_model.x])
        assert run.agreement.identical and run.agreement.answered == N_BOARDS
        # A board that computed something else (one bit of one output) is named.
        other = run.outcomes[2].value.result.outputs
        name = next(iter(other))
        other[name] = other[name].copy()
        other[name].view(np.uint8).reshape(-1)[0] ^= 1
        assert run.agreement.differ == [_targets(farm)[2]] and run.agreement.reference == _targets(farm)[0]


# --- many items over the boards, with failover ---------------------------------------------------

#: Frames per item: a few tens of ms of work on the 32x32 sample, so a board is mid-item when it is killed.
ITEM_FRAMES = 400


def test_map_survives_a_board_killed_mid_run(tmp_path_factory, rgb_model):
    """Items mapped over two boards; one is SIGKILLed with an item in flight: every item completes, on the survivor."""
    survivor, victim = [Daemon(tmp_path_factory.mktemp(f"map_board{i}")).start() for i in range(2)]
    items = list(range(40))
    expected = LocalBackend([rgb_model.path]).model().infer([rgb_model.x]).outputs
    served = {survivor.target: [], victim.target: []}
    try:
        with FarmClient([survivor.target, victim.target], [rgb_model.path]) as client:
            def work(handle, item):
                outputs = handle.infer([rgb_model.x], frame_count=ITEM_FRAMES).outputs
                return handle.client.target, outputs

            results = {}
            for index, (board, outputs) in client.map(work, items):
                assert index not in results
                results[index] = outputs
                served[board].append(index)
                if len(served[victim.target]) == 3 and victim.proc.poll() is None:
                    assert wait_until(lambda: _jobs(victim) == 1, timeout=10), "the victim is not mid-item"
                    victim.kill()
            before_kill = len(served[victim.target])
    finally:
        survivor.stop()
        victim.kill()
    assert victim.proc.returncode == -signal.SIGKILL
    assert sorted(results) == items  # every item, once
    assert all(np.array_equal(results[i][n], expected[n]) for i in items for n in expected)
    assert 3 <= before_kill < len(items) and len(served[survivor.target]) == len(items) - before_kill


def _jobs(daemon) -> int:
    with daemon.client() as c:
        return c.stats().jobs_running


def test_map_raises_when_every_board_is_lost(tmp_path_factory, rgb_model):
    board = Daemon(tmp_path_factory.mktemp("map_last")).start()
    done = []
    try:
        with FarmClient([board.target], [rgb_model.path]) as client:
            with pytest.raises(BoardUnavailable, match=r"every board was lost with \d+ of 20 items left") as exc:
                for index, _ in client.map(lambda h, item: h.infer([rgb_model.x], frame_count=ITEM_FRAMES), range(20)):
                    done.append(index)
                    if len(done) == 2:
                        board.kill()
    finally:
        board.kill()
    assert board.target in exc.value.message and len(done) < 20


def test_map_raises_an_items_own_error():
    """An error that is not a lost board (a bad item) ends the run and is raised as it is."""
    def work(board, item):
        if item == 3:
            raise InvalidInput("item 3 is bad")
        return item * 2

    got = []
    with pytest.raises(InvalidInput, match="item 3 is bad"):
        for index, value in map_with_failover({"a": None, "b": None}, work, range(10)):
            got.append((index, value))
    assert all(v == 2 * i for i, v in got)


# --- infer and model_info on every board ------------------------------------------------------

def test_cli_infer_runs_on_every_board(farm, rgb_model, scratch):
    boards = ",".join(_targets(farm))
    result = run_cli(["infer", "--model_file", rgb_model.path, "--board", boards, "--enable_dump", "true"], scratch)
    assert_ok(result)
    assert result.stdout.count("infer success") == N_BOARDS
    assert f"outputs identical on all {N_BOARDS} boards" in result.stdout
    for t in _targets(farm):  # each board's dump in a directory of its own
        assert any(f.endswith(".bin") for f in os.listdir(scratch / t.replace(":", "_")))
    info = run_cli(["model_info", "--model_file", rgb_model.path, "--board", boards], scratch)
    assert_ok(info)
    assert info.stdout.count("[model name]: sample_32x32_rgb") == N_BOARDS


def test_cli_infer_with_one_board_down_keeps_the_others(farm, rgb_model, scratch):
    down = _free_target()
    result = run_cli(["infer", "--model_file", rgb_model.path, "--board", ",".join(_targets(farm)[:2] + [down])], scratch)
    line = assert_one_error(result, "infer failed on 1 of 3 boards", exit_code=1, ignore=r"^no --input_file given")
    assert down in line
    assert result.stderr.count("no --input_file given") == 1  # said once, not once per board
    assert result.stdout.count("infer success") == 2
    assert "outputs identical on the 2 boards that answered" in result.stdout


def test_ssh_and_several_boards_do_not_mix(rgb_model, scratch):
    result = run_cli(["perf", "--model_file", rgb_model.path, "--board", "127.0.0.1:1,127.0.0.1:2",
                      "--ssh", "root@127.0.0.1"], scratch)
    assert result.returncode == 2 and "--ssh takes one board" in result.stderr, result.output
