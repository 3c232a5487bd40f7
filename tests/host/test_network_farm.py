"""The board tools over real links: four boards, each hrt_boardd in its own network namespace behind an emulated
link (bench/netlab.py): wifi, bad, one whose link goes down mid-run and comes back, and lan. The tools run as a
user runs them (their CLI, in a subprocess) in the root namespace, which reaches the boards only through their links.

These need root; they skip with one line saying why elsewhere, and fail under CI=true.
"""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from bpuemu.common.container import read_bin

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "board"))
from boardd_harness import Daemon, clean_env  # noqa: E402
from helpers.netboards import lab  # noqa: E402

pytestmark = pytest.mark.timeout(600)

#: Board 2's link goes down mid-run.
PROFILES = ("wifi", "bad", "lan", "lan")
DOWN = 2
SIZE = 32


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    with lab(PROFILES, tmp_path_factory.mktemp("netlab")) as started:
        yield started


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The rgb sample model, its quantized ONNX, and one raw input file."""
    from bpuemu.host.samples import sample_bin
    from bpuemu.common.input_types import random_rt_input

    d = tmp_path_factory.mktemp("net_sample")
    paths = {"bin": str(d / "rgb.bin"), "quanti": str(d / "rgb_quantized_model.onnx"), "input": str(d / "x.bin")}
    sample_bin(paths["bin"], input_type_rt="rgb", height=SIZE, width=SIZE, quantized_path=paths["quanti"])
    x = random_rt_input(read_bin(paths["bin"]).model().input_specs[0], np.random.default_rng(7))
    x.tofile(paths["input"])
    return paths


def _env(net):
    return clean_env(BPUEMU_TOKEN=net.token)


def _run(module, args, cwd, env, timeout=300):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_farm_perf_over_the_links_rides_out_an_outage(net, sample, tmp_path):
    """hrt_model_exec perf on the four boards, board 2's link down for 3 s in the middle: every board's job
    finishes, within its deadline, and the table has all four."""
    targets = ",".join(b.target for b in net.boards)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "bpuemu.board.cli.hrt_model_exec", "perf", "--model_file",
                             sample["bin"], "--board", targets, "--perf_time", "0.1"], cwd=tmp_path, env=_env(net),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4.0)  # the models are uploaded and the 6 s jobs run
    net.down(net.boards[DOWN], 3.0)
    out, err = proc.communicate(timeout=180)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, out + err
    assert "Traceback" not in err
    assert "Board farm perf: 4 boards, 4 succeeded, 0 failed" in out, out
    for board in net.boards:
        assert board.target in out
    assert elapsed < 120, elapsed


def _comparison_lines(stdout: str, targets) -> set:
    """The verifier's comparison lines (pairs, mismatch counts, errors, cosines, verdicts), each board named Arm."""
    text = stdout
    for target in targets:
        text = text.replace(f"Arm({target})", "Arm")
    skip = ("infer:", "comparison(s)", "input data", "progress", "board ", "opened")
    return {ln for ln in text.splitlines() if ln.startswith("INFO ") and not any(w in ln for w in skip)}


def test_hb_verifier_against_the_four_boards_matches_one_local_board(net, sample, tmp_path):
    """hb_verifier against all four namespaced boards passes, and compares the same values as against one board on
    loopback."""
    boards = ",".join(f"grpc://{b.target}" for b in net.boards)
    args = ["-m", f"{sample['quanti']},{sample['bin']}", "-s", "True", "-i", sample["input"]]
    over = _run("bpuemu.host.cli.hb_verifier", [*args, "-b", boards], tmp_path, _env(net))
    assert over.returncode == 0, over.stdout + over.stderr
    assert "Traceback" not in over.stderr
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    daemon = Daemon(tmp_path / "local_board").start()
    try:
        local = _run("bpuemu.host.cli.hb_verifier", [*args, "-b", f"grpc://{daemon.target}"], local_dir, clean_env())
    finally:
        daemon.stop()
    assert local.returncode == 0, local.stdout + local.stderr
    assert "all 9 comparison(s) PASSED" in over.stdout and "all 3 comparison(s) PASSED" in local.stdout
    remote_lines = _comparison_lines(over.stdout, [b.target for b in net.boards])
    local_lines = _comparison_lines(local.stdout, [daemon.target])
    assert any("Quanti.onnx VS Arm" in ln for ln in local_lines), local.stdout
    assert local_lines <= remote_lines, (sorted(local_lines - remote_lines), over.stdout)


def test_a_board_whose_link_is_down_is_one_error_line_within_the_deadline(net, sample, tmp_path):
    """hrt_model_exec against a board whose link is down: it ends at the client's deadline (10 s to connect) with
    one ERROR line naming the board, not a hang and not a traceback; the board serves again once its link is back."""
    board = net.boards[DOWN]
    net.down(board, 16.0)
    start = time.monotonic()
    result = _run("bpuemu.board.cli.hrt_model_exec", ["model_info", "--model_file", sample["bin"], "--board",
                                                       board.target], tmp_path, _env(net), timeout=120)
    elapsed = time.monotonic() - start
    assert result.returncode != 0 and "Traceback" not in result.stdout + result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("ERROR")]
    assert len(errors) == 1 and board.target in errors[0], result.stderr
    assert elapsed < 10 + 5, f"the call ended after {elapsed:.1f} s (deadline 10 s)"
    time.sleep(max(0.0, 16.0 - (time.monotonic() - start)) + 1.0)
    deadline = time.monotonic() + 60
    while True:  # the link is back: the board answers again (TCP's own retransmission backoff first)
        again = _run("bpuemu.board.cli.hrt_model_exec", ["model_info", "--model_file", sample["bin"], "--board",
                                                          board.target], tmp_path, _env(net), timeout=120)
        if again.returncode == 0 or time.monotonic() > deadline:
            break
    assert again.returncode == 0, again.stdout + again.stderr
