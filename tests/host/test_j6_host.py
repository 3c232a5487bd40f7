"""The J6 flow's host half: HBRuntime (.onnx, .bc, .hbm), hbm_infer on a nash board, hb_verifier .bc vs .hbm vs
board, hb_model_info and hb_perf on an .hbm. Real daemons on loopback (hrt_boardd --march nash-e), real files."""
import html
import json
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from sshd_harness import REMOTE_COMMAND, Daemon, Sshd, clean_env

from bpuemu.common.container import read_bc, read_bin, write_bc
from bpuemu.common.errors import BoardUnavailable, InvalidInput
from bpuemu.common.input_types import random_rt_inputs
from helpers.j6 import SHAPE, compile_tiny


@pytest.fixture(scope="module")
def fm(tmp_path_factory):
    """The tiny model compiled for nash-e with a featuremap input (.hbm, .bc, ptq .onnx)."""
    return compile_tiny(tmp_path_factory.mktemp("j6_fm"), "nash-e", "featuremap")


@pytest.fixture(scope="module")
def nv12(tmp_path_factory):
    return compile_tiny(tmp_path_factory.mktemp("j6_nv12"), "nash-e", "nv12")


@pytest.fixture(scope="module")
def nash_board(tmp_path_factory):
    daemon = Daemon(tmp_path_factory.mktemp("hrt_boardd_nash"), "--march", "nash-e").start()
    yield daemon
    assert daemon.stop() == 0, daemon.log()


def _frames(n=3):
    rng = np.random.default_rng(7)
    return [rng.normal(0, 1, SHAPE).astype(np.float32) for _ in range(n)]


def test_hbruntime_runs_onnx_bc_and_hbm_and_the_bc_and_hbm_agree_bit_for_bit(fm):
    from horizon_tc_ui.hb_runtime import HBRuntime

    hbm, bc, onnx_model = HBRuntime(fm.bin), HBRuntime(fm.bc), HBRuntime(fm.quantized)
    assert (hbm.kind, bc.kind, onnx_model.kind) == ("hbm", "bc", "onnx")
    for sess in (hbm, bc, onnx_model):
        assert sess.input_names == ["data"] and sess.output_names == ["c2"]
        assert sess.input_shapes == {"data": list(SHAPE)}
    for x in _frames():
        a, = hbm.run(None, {"data": x})
        b, = bc.run(["c2"], {"data": x})
        c, = onnx_model.run(None, {"data": x})
        assert a.dtype == b.dtype and np.array_equal(a, b), "the .hbm and its .bc differ"
        assert np.array_equal(b, c)   # the .bc carries the ptq model
    with pytest.raises(InvalidInput, match="missing"):
        hbm.run(None, {"x": _frames(1)[0]})
    with pytest.raises(InvalidInput, match="not an output"):
        bc.run(["nope"], {"data": _frames(1)[0]})


def test_hbm_infer_on_a_nash_board_gives_what_hbruntime_gives_uploading_once(fm, nv12, nash_board):
    from horizon_tc_ui.hb_runtime import HBRuntime

    from bpuemu.host.hbm_infer import HbmInfer

    for art in (fm, nv12):
        host = HBRuntime(art.bin)
        spec = read_bin(art.bin).model().input_specs[0]
        with HbmInfer(art.bin, f"grpc://{nash_board.target}", timeout_s=20) as board:
            assert (board.input_names, board.output_names) == (host.input_names, host.output_names)
            assert board.input_shapes == host.input_shapes
            for seed in range(3):
                x = random_rt_inputs([spec], seed)[0]
                got, = board.run(None, {"data": x})
                want, = host.run(None, {"data": x})
                assert got.dtype == want.dtype and np.array_equal(got, want)
    with nash_board.client() as client:   # each model was uploaded once and is stored once
        assert sorted(m.sha256 for m in client.list_models()) == sorted([fm.sha256, nv12.sha256])


def test_hbm_infer_errors_are_one_line_with_deadlines(fm, nash_board, tmp_path):
    from bpuemu.host.hbm_infer import HbmInfer

    with pytest.raises(BoardUnavailable):
        HbmInfer(fm.bin, "127.0.0.1:1", timeout_s=3)
    with HbmInfer(fm.bin, nash_board.target) as board:
        with pytest.raises(InvalidInput, match="missing"):
            board.run(None, {})
    x5 = Daemon(tmp_path / "x5board").start()   # the default march: bayes-e
    try:
        run = subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hbm_infer", fm.bin, "-b", x5.target,
                              "--timeout", "20"], capture_output=True, text=True, timeout=120, env=clean_env())
    finally:
        assert x5.stop() == 0
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "Traceback" not in out
    errors = [line for line in out.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and "nash-e" in errors[0] and "bayes-e" in errors[0], out


def test_hbm_infer_console_script_saves_the_outputs(fm, nash_board, tmp_path):
    from horizon_tc_ui.hb_runtime import HBRuntime

    x = _frames(1)[0]
    x.tofile(tmp_path / "x.bin")
    run = subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hbm_infer", fm.bin, "-b", nash_board.target,
                          "-i", str(tmp_path / "x.bin"), "-o", str(tmp_path / "out"), "--frame_count", "3"],
                         capture_output=True, text=True, timeout=120, env=clean_env())
    assert run.returncode == 0, run.stderr
    assert "output c2: shape [1, 2, 8, 12]" in run.stdout
    assert np.array_equal(np.load(tmp_path / "out" / "c2.npy"), HBRuntime(fm.bin).run(None, {"data": x})[0])


def _hb_verifier(*args):
    return subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_verifier", *args], capture_output=True,
                          text=True, timeout=180, env=clean_env())


def test_hb_verifier_passes_bc_vs_hbm_on_the_host_vs_hbm_on_a_board(fm, nash_board):
    run = _hb_verifier("-m", f"{fm.bc},{fm.bin}", "-s", "True", "-b", f"grpc://{nash_board.target}")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all 3 comparison(s) PASSED" in run.stdout + run.stderr
    for pair in ("Quantized.bc VS Sim", "Quantized.bc VS Arm", "Arm VS Sim"):
        assert pair in run.stdout + run.stderr


def test_hb_verifier_passes_the_removed_node_bc_vs_the_hbm_on_a_board(nash_board, tmp_path):
    art = compile_tiny(tmp_path, "nash-e", "featuremap", matmul_tail=True, remove_node_type="Dequantize")
    assert art.removed_bc and list(read_bin(art.bin).model().build_info.deleted_nodes)
    run = _hb_verifier("-m", f"{art.removed_bc},{art.bin}", "-s", "True", "-b", f"grpc://{nash_board.target}")
    assert run.returncode == 0 and "all 3 comparison(s) PASSED" in run.stdout + run.stderr, run.stdout + run.stderr


def test_hb_verifier_names_the_first_diverging_node_of_a_bc_that_differs(fm, nash_board, tmp_path):
    bc = read_bc(fm.bc)
    m = onnx.load_from_string(bc.onnx_bytes)
    w = next(t for t in m.graph.initializer if t.name == "w2_quantized")
    a = numpy_helper.to_array(w).copy()
    a.flat[0] = 50 if a.flat[0] != 50 else -50
    w.CopyFrom(numpy_helper.from_array(a, w.name))
    write_bc(tmp_path / "changed.bc", bc.manifest, m.SerializeToString())
    run = _hb_verifier("-m", f"{tmp_path / 'changed.bc'},{fm.bin}", "-b", f"grpc://{nash_board.target}", "-r", "True")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    first = [line for line in out.splitlines() if "first divergence" in line]
    assert first and "made by node 'conv2' (Conv)" in first[0], out
    assert ", in .hbm step 'BPU_tiny_subgraph_0'" in first[0] and ".bin" not in first[0], out


def test_hb_model_info_and_hb_perf_read_the_hbm(fm, tmp_path):
    info = subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_model_info", fm.bin, "--json"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=clean_env())
    assert info.returncode == 0, info.stderr
    assert "tiny" in json.dumps(json.loads(info.stdout))
    perf = subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_perf", fm.bin], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=clean_env())
    assert perf.returncode == 0, perf.stderr
    j6 = [line for line in perf.stderr.splitlines() if "on nash-e (J6E)" in line]
    assert j6 and "modeled" in j6[0] and "assumed" in j6[0], perf.stderr
    assert "stores the X5 timing of another parameter set" not in perf.stderr
    page = (tmp_path / "hb_perf_result" / "tiny" / "tiny.html").read_text()   # the report: the march's figures
    from bpuemu.common import x5_timing
    from bpuemu.common.march import march

    on_march = x5_timing.march_steps(read_bin(fm.bin).model())
    shown = float(re.search(r"<td>Model Latency\(ms\)</td><td class=\"num\">([0-9.e-]+)</td>", page).group(1))
    assert shown == pytest.approx(on_march.bpu_us / 1e3, abs=1e-6)
    assert "<h2>Plan Steps on nash-e (J6E)</h2>" in page and html.escape(march("nash-e").timing.label) in page


def _ssh_args(server):
    return ["-u", server.user, "--identity", server.user_key, "--known-hosts", server.known_hosts,
            "--remote-command", REMOTE_COMMAND, "--remote-tmp", server.remote_tmp]


def test_hb_verifier_over_ssh_runs_the_hbm_on_the_boards_own_march(fm, tmp_path):
    """Over SSH the board's own hrt_model_exec runs the .hbm: a nash-e board says so in its environment
    (BPUEMU_BOARD_MARCH, here sshd's SetEnv) and the J6 pair PASSes; a board that says nothing is the X5, and
    the .hbm is refused with one line naming both marches and the setting."""
    nash = Sshd(tmp_path / "nash", board_env={"BPUEMU_BOARD_MARCH": "nash-e"}).start()
    try:
        run = _hb_verifier("-m", f"{fm.bc},{fm.bin}", "-s", "True", "-b", f"ssh://{nash.address}", *_ssh_args(nash))
    finally:
        nash.stop()
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "all 3 comparison(s) PASSED" in out, out
    assert f"board {nash.target} over SSH (" in out
    x5 = Sshd(tmp_path / "x5").start()
    try:
        run = _hb_verifier("-m", f"{fm.bc},{fm.bin}", "-b", f"ssh://{x5.address}", *_ssh_args(x5))
    finally:
        x5.stop()
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "Traceback" not in out, out
    assert "compiled for march nash-e; this board is bayes-e" in out and "BPUEMU_BOARD_MARCH=nash-e" in out, out
