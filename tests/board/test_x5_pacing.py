"""hrt_boardd --timing x5: a real daemon's infer and perf take the modeled X5 time per frame."""
import json

import pytest

from boardd_harness import run_cli


@pytest.fixture(scope="module")
def slow_bin(tmp_path_factory):
    """A small model whose stored X5 timing is slow enough for the pacing to dominate (its BPU subgraph
    modeled at ~40 ms, its CPU work at ~10 ms per frame): the same model, timed with other parameters."""
    from bpuemu.common.container import read_bin, write_bin
    from bpuemu.host.samples import sample_bin
    from bpuemu.host.tools.static_perf import X5_BPU, annotate

    d = tmp_path_factory.mktemp("x5_slow")
    path = str(d / "fast.bin")
    sample_bin(path, height=16, width=16)
    b = read_bin(path)
    model = b.model()
    annotate(model, b.blobs, X5_BPU.with_values(subgraph_overhead_us=40000.0, task_overhead_us=10000.0))
    slow = str(d / "slow.bin")
    write_bin(slow, [model], b.blobs)
    return slow


def _perf(target, model, scratch, threads, frames):
    r = run_cli(["perf", "--model_file", model, "--board", target, "--thread_num", str(threads),
                 "--frame_count", str(frames), "--json"], scratch)
    assert r.returncode == 0, r.output
    doc = json.loads(r.stdout)
    return doc["result"], doc["x5"]


def test_timing_x5_makes_perf_run_at_the_modeled_fps(start_daemon, slow_bin, scratch):
    daemon = start_daemon("--timing", "x5")
    for threads in (1, 2):
        host, x5 = _perf(daemon.target, slow_bin, scratch, threads, 12)
        # Pacing never lets the board run faster than the modeled X5 (5 %: the measured window's
        # edges); a busy host adds its own gaps between frames, so slower is allowed within reason.
        assert 0.75 * x5["fps"] <= host["fps"] <= 1.05 * x5["fps"], (threads, host, x5)
        assert host["average_latency_ms"] >= 0.95 * x5["latency_1thread_ms"]
    # two threads: the BPU is shared (40 ms per frame), the CPU part (10 ms) overlaps
    assert x5["fps"] == pytest.approx(1e3 / x5["bpu_ms"], rel=0.1) and x5["fps"] < 2 * 1e3 / (x5["bpu_ms"] + x5["cpu_ms"])
    r = run_cli(["infer", "--model_file", slow_bin, "--board", daemon.target, "--frame_count", "3", "--json"], scratch)
    assert r.returncode == 0, r.output
    assert min(json.loads(r.stdout)["latency_ms"]) >= 0.95 * x5["latency_1thread_ms"]


def test_the_default_board_runs_as_fast_as_the_host(board, slow_bin, scratch):
    host, x5 = _perf(board.target, slow_bin, scratch, 2, 12)
    assert host["fps"] > 2 * x5["fps"]
