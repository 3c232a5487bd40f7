"""hb_verifier end to end: quanti.onnx vs the x86 simulator vs a real board (gRPC daemon, SSH).

Real parts throughout: onnxruntime runs quanti.onnx, the board runtime runs the
`.bin` in-process and in a hrt_boardd on loopback (and behind a real sshd).
Perturbed models are real files with one weight changed: a changed quanti.onnx
or `.bin` must fail exactly the pairs it breaks, and -r must name where the
two sides first diverge.
"""
import json
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from bpuemu.board.backends import Platform
from bpuemu.common.container import read_bin, write_bin
from bpuemu.common.errors import BoardUnavailable, InvalidInput
from bpuemu.common.proto import model_pb2
from bpuemu.host.verifier.core import SIM, VerifyOptions, platform_notes, verify
from bpuemu.host.verifier.inputs import load_inputs, parse_input_arg
from bpuemu.host.verifier.report import SideInfo
from bpuemu.host.verifier.sides import SideRun

from sshd_harness import REMOTE_COMMAND, Daemon, Sshd, assert_ok, assert_one_error, clean_env, run_cli

SIZE = 32
PAIRS = ("Quanti.onnx VS Arm", "Quanti.onnx VS Sim", "Arm VS Sim")


def hb_verifier(args, cwd):
    return run_cli(args, cwd, module="bpuemu.host.cli.hb_verifier")


def verdicts(stdout: str) -> dict:
    """'Quanti.onnx and Arm' -> 'PASSED' / 'FAILED', from the strict check lines."""
    out = {}
    for line in stdout.splitlines():
        if "result Strict check" in line and not line.split(" ", 1)[1].startswith("raw output"):
            pair = line.split(" ", 1)[1].split(" result Strict check")[0]
            out[pair] = line.rsplit(" ", 1)[1]
    return out


# --- fixtures -------------------------------------------------------------------

class Sample:
    def __init__(self, directory, kind):
        from bpuemu.host.samples import sample_bin

        self.kind = kind
        self.bin = os.path.join(directory, f"{kind}.bin")
        self.quanti = os.path.join(directory, f"{kind}_quantized_model.onnx")
        sample_bin(self.bin, input_type_rt=kind, height=SIZE, width=SIZE, quantized_path=self.quanti)
        self.model = read_bin(self.bin).model()


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    d = tmp_path_factory.mktemp("verifier_samples")
    return {kind: Sample(d, kind) for kind in ("rgb", "nv12", "featuremap")}


@pytest.fixture(scope="module")
def cpu_middle(tmp_path_factory):
    """Conv -> Softmax (CPU) -> Conv -> HzDequantize: two BPU subgraphs, and an output with a scale."""
    from helpers import models

    d = tmp_path_factory.mktemp("verifier_cpu_middle")
    case = models.build_case(d, models.cpu_middle_model(), "cpu_middle", per_channel=True)
    case.quanti = str(d / "cpu_middle_quantized_model.onnx")
    onnx.save(case.qmodel, case.quanti)
    return case


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    daemon = Daemon(tmp_path_factory.mktemp("verifier_boardd")).start()
    try:
        yield daemon
    finally:
        assert daemon.stop() == 0, daemon.log()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("verifier_sshd")).start()
    try:
        yield server
    finally:
        server.stop()


def perturb_quanti(src: str, dst: str, weight: str) -> None:
    """Copy a quantized model with one int8 weight changed."""
    m = onnx.load(src)
    init = next(t for t in m.graph.initializer if t.name == weight)
    w = numpy_helper.to_array(init).copy()
    flat = w.reshape(-1)
    flat[0] = np.int8(-100 if flat[0] > 0 else 100)
    init.CopyFrom(numpy_helper.from_array(w, weight))
    onnx.save(m, dst)


def perturb_bin_weight(src: str, dst: str, step_name: str) -> None:
    """Copy a .bin with one int8 weight inside one compiled piece changed (re-written by write_bin)."""
    binfile = read_bin(src)
    model = model_pb2.Model()
    model.CopyFrom(binfile.model())
    blobs = dict(binfile.blobs)
    step = next(s for s in model.plan if s.name == step_name)
    piece = onnx.load_from_string(blobs[step.blob])
    init = next(t for t in piece.graph.initializer if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 4)
    w = numpy_helper.to_array(init).copy()
    w.reshape(-1)[0] = np.int8(-100 if w.reshape(-1)[0] > 0 else 100)
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    blobs[step.blob] = piece.SerializeToString()
    write_bin(dst, [model], blobs)


# --- three-way PASS ----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["rgb", "nv12", "featuremap"])
def test_three_way_pass_over_grpc(samples, board, tmp_path, kind):
    s = samples[kind]
    report_path = tmp_path / "report.json"
    result = hb_verifier(["-m", f"{s.quanti},{s.bin}", "-b", f"grpc://{board.target}", "-s", "True",
                          "--json", str(report_path)], tmp_path)
    assert_ok(result)
    assert verdicts(result.stdout) == {"Quanti.onnx and Arm": "PASSED", "Quanti.onnx and Sim": "PASSED",
                                       "Arm and Sim": "PASSED"}
    for pair in PAIRS:
        assert f"compare source: {pair}" in result.stdout
    assert "mismatch result num: 0" in result.stdout and "mismatch.line_diff num: 0" in result.stdout
    assert "total result num: 10" in result.stdout
    assert "Compare progress: 100%" in result.stderr
    assert "all 3 comparison(s) PASSED" in result.stdout
    report = json.loads(report_path.read_text())
    assert report["passed"] is True and [p["source"] for p in report["pairs"]] == list(PAIRS)
    assert [s["label"] for s in report["sides"]] == ["Quanti.onnx", "Sim", "Arm"]
    assert all(p["outputs"][0]["max_abs_error"] == 0 for p in report["pairs"])


def test_three_way_pass_over_ssh(samples, sshd, tmp_path):
    s = samples["rgb"]
    result = hb_verifier(["-m", f"{s.quanti},{s.bin}", "-b", sshd.address, "-u", "root", "--identity",
                          sshd.user_key, "--known-hosts", sshd.known_hosts, "--remote-command", REMOTE_COMMAND,
                          "--remote-tmp", sshd.remote_tmp, "-s", "True", "-r", "True"], tmp_path)
    assert_ok(result)
    assert verdicts(result.stdout) == {"Quanti.onnx and Arm": "PASSED", "Quanti.onnx and Sim": "PASSED",
                                       "Arm and Sim": "PASSED"}
    assert f"board {sshd.target} over SSH (" in result.stdout
    assert "no divergence in 3 shared tensor(s)" in result.stdout  # data, the subgraph output, prob


def test_image_and_raw_inputs(samples, tmp_path):
    from PIL import Image

    img = tmp_path / "img.png"
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)).save(img)
    for kind in ("rgb", "nv12"):
        s = samples[kind]
        report = verify(VerifyOptions(bin_model=s.bin, quanti_model=s.quanti, run_sim=True, input_files=str(img)))
        assert report.passed and report.inputs == [f"data: {img}"]
    raw = tmp_path / "frame.bin"
    rng.integers(0, 256, SIZE * SIZE * 3 // 2, dtype=np.uint8).tofile(raw)  # nv12 bytes
    s = samples["nv12"]
    report = verify(VerifyOptions(bin_model=s.bin, quanti_model=s.quanti, run_sim=True, input_files=f"data:{raw}"))
    assert report.passed and report.pairs[0].outputs[0].total == 10


def test_several_boards(samples, board, tmp_path):
    s = samples["featuremap"]
    report = verify(VerifyOptions(bin_model=s.bin, quanti_model=s.quanti, boards=[board.target, board.target]))
    label = f"Arm({board.target})"
    assert [p.source for p in report.pairs] == [f"Quanti.onnx VS {label}"] * 2 + [f"{label} VS {label}"]
    assert report.passed


# --- perturbed models FAIL the right pairs ---------------------------------------------

def test_perturbed_quantized_model_fails_the_quanti_pairs(samples, board, tmp_path):
    s = samples["rgb"]
    bad = str(tmp_path / "perturbed_quantized_model.onnx")
    perturb_quanti(s.quanti, bad, "Conv_0_w_quantized")
    report_path = tmp_path / "r.json"
    result = hb_verifier(["-m", f"{bad},{s.bin}", "-b", f"grpc://{board.target}", "-s", "True",
                          "--json", str(report_path)], tmp_path)
    assert result.returncode == 1, result.output
    assert "Traceback" not in result.output
    assert verdicts(result.stdout) == {"Quanti.onnx and Arm": "FAILED", "Quanti.onnx and Sim": "FAILED",
                                       "Arm and Sim": "PASSED"}
    assert "WARNING raw output prob and raw output prob result Strict check FAILED" in result.stdout
    assert "2 of 3 comparison(s) FAILED: Quanti.onnx VS Arm, Quanti.onnx VS Sim" in result.stdout
    assert "both ran on this host" in result.stdout  # the Quanti.onnx VS Sim diagnosis
    pairs = {p["source"]: p for p in json.loads(report_path.read_text())["pairs"]}
    q_arm = pairs["Quanti.onnx VS Arm"]["outputs"][0]
    assert q_arm["mismatch"]["line_diff"] > 0 and q_arm["max_abs_error"] > 1e-5 and not pairs["Quanti.onnx VS Arm"]["passed"]
    assert pairs["Arm VS Sim"]["outputs"][0]["max_abs_error"] == 0


def test_perturbed_bin_fails_the_quanti_pairs(samples, board, tmp_path):
    s = samples["featuremap"]
    bad = str(tmp_path / "perturbed.bin")
    perturb_bin_weight(s.bin, bad, "BPU_sample_32x32_featuremap_subgraph_0")
    result = hb_verifier(["-m", f"{s.quanti},{bad}", "-b", f"grpc://{board.target}", "-s", "True", "-r", "True"], tmp_path)
    assert result.returncode == 1, result.output
    assert verdicts(result.stdout) == {"Quanti.onnx and Arm": "FAILED", "Quanti.onnx and Sim": "FAILED",
                                       "Arm and Sim": "PASSED"}
    first = [line for line in result.stdout.splitlines() if "first divergence" in line]
    assert len(first) == 2, result.stdout  # one per failing pair
    for line in first:
        assert "tensor 'logits_QuantizeLinear_Output'" in line
        assert "BPU_sample_32x32_featuremap_subgraph_0" in line, line
    assert "[1] data_QuantizeLinear_Output: mismatch 0/3072" in result.stdout  # the input quantize still agrees


@pytest.mark.parametrize("weight, tensor, node", [
    ("Conv_b_w_quantized", "y_QuantizeLinear_Output", "Conv_b"),
    ("Conv_a_w_quantized", "Conv_a_relu_QuantizeLinear_Output", "Conv_a"),
])
def test_dump_all_names_the_first_diverging_node(cpu_middle, tmp_path, weight, tensor, node):
    bad = str(tmp_path / "perturbed_quantized_model.onnx")
    perturb_quanti(cpu_middle.quanti, bad, weight)
    report = verify(VerifyOptions(bin_model=cpu_middle.path, quanti_model=bad, run_sim=True, dump_all=True))
    (pair,) = report.pairs
    assert not pair.passed
    d = pair.first_divergence
    assert d is not None and d.tensor == tensor and d.node == node and d.op_type == "Conv"
    names = [c.name_b for c in pair.layers]
    before = names[: names.index(tensor)]
    assert "x_QuantizeLinear_Output" in before  # the tensors before it were compared, and agree
    assert all(c.passed for c in pair.layers[: len(before)])
    assert f"tensor '{tensor}' made by node '{node}' (Conv)" in report.text()


def test_lsb_tolerance_uses_the_output_scale(cpu_middle, tmp_path):
    """A .bin whose HzDequantize scale is 0.2% off: outside 5 digits, well inside 1 LSB of that scale."""
    binfile = read_bin(cpu_middle.path)
    model = model_pb2.Model()
    model.CopyFrom(binfile.model())
    step = next(s for s in model.plan if s.kind == model_pb2.PlanStep.DEQUANTIZE)
    scale = list(step.scale)
    step.scale[:] = [v * 1.002 for v in scale]
    bad = str(tmp_path / "rescaled.bin")
    write_bin(bad, [model], binfile.blobs)
    strict = verify(VerifyOptions(bin_model=bad, quanti_model=cpu_middle.quanti, run_sim=True))
    c = strict.pairs[0].outputs[0]
    assert not strict.passed and c.mismatch.line_diff > 0
    # |q - zero_point| <= 255, so the error is at most 255 * 0.2% = 0.51 of a step.
    assert 0 < c.max_lsb_error <= 0.52 and c.scale == pytest.approx([v * 1.002 for v in scale])  # the .bin's step
    assert verify(VerifyOptions(bin_model=bad, quanti_model=cpu_middle.quanti, run_sim=True, lsb=1)).passed
    assert not verify(VerifyOptions(bin_model=bad, quanti_model=cpu_middle.quanti, run_sim=True, lsb=0.01)).passed


# --- removed nodes ---------------------------------------------------------------------

def test_removed_dequantize_is_compared_in_float(cpu_middle, tmp_path):
    from bpuemu.host.compiler.modifier import modify

    binfile = read_bin(cpu_middle.path)
    model, blobs, removed = modify(binfile.model(), binfile.blobs, types=["Dequantize"])
    assert [r.op_type for r in removed] == ["Dequantize"]
    path = str(tmp_path / "no_dequantize.bin")
    write_bin(path, [model], blobs)
    report = verify(VerifyOptions(bin_model=path, quanti_model=cpu_middle.quanti, run_sim=True))
    assert report.passed, report.text()
    c = report.pairs[0].outputs[0]
    assert c.dtype_a == "float32" and c.total > 0 and c.max_lsb_error == 0


def test_removed_softmax_is_refused_with_the_seed_reason(samples, board, tmp_path):
    from bpuemu.host.compiler.modifier import modify

    s = samples["rgb"]
    binfile = read_bin(s.bin)
    model, blobs, removed = modify(binfile.model(), binfile.blobs, names=["Softmax_prob"])
    path = str(tmp_path / "no_softmax.bin")
    write_bin(path, [model], blobs)
    result = hb_verifier(["-m", f"{s.quanti},{path}", "-s", "True"], tmp_path)
    line = assert_one_error(result, "does not support comparing bin models", "other than Dequantize", "Softmax_prob")
    assert "Hint: avoid removing the last node before output" in result.stderr, line
    # The .bin alone can still be checked: simulator against board, no quanti.onnx involved.
    alone = verify(VerifyOptions(bin_model=path, run_sim=True, boards=[board.target]))
    assert [p.source for p in alone.pairs] == ["Arm VS Sim"] and alone.passed


# --- errors: one clear line each ----------------------------------------------------------

def test_unreachable_grpc_board(samples, tmp_path):
    s = samples["rgb"]
    result = hb_verifier(["-m", f"{s.quanti},{s.bin}", "-b", "grpc://127.0.0.1:1", "-s", "True"], tmp_path)
    assert_one_error(result, "127.0.0.1:1", "unreachable", exit_code=1)


def test_grpc_board_dying_mid_run(samples, tmp_path):
    s = samples["rgb"]
    daemon = Daemon(tmp_path / "boardd").start()
    lines = []

    def echo(line):
        lines.append(line)
        if line.startswith("INFO Arm: opened"):  # model uploaded and loaded; the board dies before infer
            daemon.kill()

    try:
        with pytest.raises(BoardUnavailable, match="127.0.0.1"):
            verify(VerifyOptions(bin_model=s.bin, quanti_model=s.quanti, boards=[daemon.target]), echo=echo)
    finally:
        daemon.kill()
    assert any(line.startswith("INFO Arm: opened") for line in lines)


def test_ssh_board_dying_mid_run(samples, sshd, tmp_path):
    import shutil
    import stat

    die = tmp_path / "dying_board.sh"
    die.write_text("#!/bin/sh\np=$$\nwhile [ \"$p\" -gt 1 ]; do\n  p=$(awk '{print $4}' /proc/$p/stat)\n"
                   "  if [ \"$(cat /proc/$p/comm)\" = sshd ]; then kill -KILL \"$p\"; exit 0; fi\ndone\n")
    die.chmod(die.stat().st_mode | stat.S_IXUSR)
    s = samples["rgb"]
    before = sshd.work_dirs()
    result = hb_verifier(["-m", f"{s.quanti},{s.bin}", "-b", sshd.address, "--identity", sshd.user_key,
                          "--known-hosts", sshd.known_hosts, "--remote-command", str(die), "--remote-tmp", sshd.remote_tmp,
                          "-s", "True"], tmp_path)
    assert_one_error(result, "lost during infer", sshd.address)
    assert "Strict check" not in result.stdout
    for leftover in sshd.work_dirs() - before:
        shutil.rmtree(leftover)


def test_ssh_authentication_failure(samples, sshd, tmp_path):
    s = samples["rgb"]
    result = hb_verifier(["-m", f"{s.quanti},{s.bin}", "-b", sshd.address, "-p", "wrong",
                          "--known-hosts", sshd.known_hosts], tmp_path)
    assert_one_error(result, "refused SSH authentication", "password")


def test_nothing_to_compare(samples, tmp_path):
    s = samples["rgb"]
    result = hb_verifier(["-m", f"{s.quanti},{s.bin}"], tmp_path)
    assert_one_error(result, "nothing to compare", exit_code=1)


def test_bad_model_argument_is_a_usage_error(samples, tmp_path):
    result = hb_verifier(["-m", samples["rgb"].quanti, "-s", "True"], tmp_path)
    assert result.returncode == 2 and "quanti.onnx,model.bin" in result.stderr and "Traceback" not in result.output


def test_mismatched_files_are_refused(samples, tmp_path):
    with pytest.raises(InvalidInput, match="not the same model"):
        verify(VerifyOptions(bin_model=samples["featuremap"].bin, quanti_model=samples["rgb"].quanti, run_sim=True))


def test_wrong_input_count_and_names(samples, cpu_middle, tmp_path):
    spec = cpu_middle.model.input_specs
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    with pytest.raises(InvalidInput, match="1 input"):
        load_inputs(f"{a},{b}", spec)
    with pytest.raises(InvalidInput, match="names input.* nope"):
        load_inputs(f"nope:{a}", spec)
    with pytest.raises(InvalidInput, match="image"):
        load_inputs(str(tmp_path / "x.txt"), spec)


def test_named_inputs_go_to_their_input(tmp_path):
    from helpers import models

    case = models.build_case(tmp_path, models.two_input_model(size=8), "two_input", per_channel=False)
    specs = case.model.input_specs
    rng = np.random.default_rng(5)
    fa, fb = tmp_path / "fa.bin", tmp_path / "fb.bin"
    xa = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    xb = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
    xa.tofile(fa)
    xb.tofile(fb)
    assert parse_input_arg(f"b:{fb},a:{fa}") == [("b", str(fb)), ("a", str(fa))]
    loaded = load_inputs(f"b:{fb},a:{fa}", specs)
    assert [x.name for x in loaded] == ["a", "b"]
    assert np.array_equal(loaded[0].data, xa) and np.array_equal(loaded[1].data, xb)
    quanti = str(tmp_path / "two_input_quantized_model.onnx")
    onnx.save(case.qmodel, quanti)
    assert verify(VerifyOptions(bin_model=case.path, quanti_model=quanti, run_sim=True, input_files=f"b:{fb},a:{fa}")).passed


# --- platform notes --------------------------------------------------------------------

def _side(label, platform, quanti=False):
    return SideRun(SideInfo(label, "m", "", str(platform)), {}, {}, platform, is_quanti=quanti)


def test_platform_notes_name_the_difference():
    host = Platform("x86_64", "1.32.0")
    arm = _side("Arm", Platform("aarch64", "1.20.0"))
    sim = _side(SIM, host)
    (note,) = platform_notes(arm, sim, host)
    assert "platform difference" in note and "CPU arch aarch64 vs x86_64" in note and "onnxruntime 1.20.0 vs 1.32.0" in note
    same = _side("Arm", host)
    (note,) = platform_notes(same, sim, host)
    assert "does not explain this" in note
    assert "onnxruntime 1.31.0 vs 1.32.0" in platform_notes(_side("Quanti.onnx", host, True),
                                                            _side("Arm", Platform("x86_64", "1.31.0")), host)[0]
    assert "both ran on this host" in platform_notes(_side("Quanti.onnx", host, True), sim, host)[0]


# --- how -b reaches a board: HOST is SSH (the seed), grpc://HOST is hrt_boardd ----------

def test_seed_line_with_user_and_password_goes_over_ssh(samples, sshd, tmp_path):
    """hb_verifier -m q.onnx,m.bin -b IP -u root -p PASSWORD: SSH, as the seed says (the password is refused here)."""
    s = samples["rgb"]
    result = hb_verifier(["-m", f"{s.quanti},{s.bin}", "-b", sshd.address, "-u", "root", "-p", "not-the-password",
                          "--known-hosts", sshd.known_hosts], tmp_path)
    assert_one_error(result, "refused SSH authentication", sshd.address)
    assert result.stderr.splitlines()[-1] == "Hint: check the user (-u), the password (-p) or the key (--identity)"


def test_seed_line_with_user_and_password_verifies_over_ssh(samples, tmp_path_factory, tmp_path):
    """The seed's line, -b IP -u root -p PASSWORD, against a real sshd that takes that password for root."""
    server = Sshd(tmp_path_factory.mktemp("verifier_sshd_password"), root_password="bpuemu-board-pw").start()
    try:
        s = samples["rgb"]
        # Beyond the seed's flags: this test's own known_hosts and where hrt_model_exec lives on this "board".
        local = ["--known-hosts", server.known_hosts, "--remote-command", REMOTE_COMMAND, "--remote-tmp", server.remote_tmp]
        result = hb_verifier(["-m", f"{s.quanti},{s.bin}", "-b", server.address, "-s", "True", "-u", "root",
                              "-p", "bpuemu-board-pw", *local], tmp_path)
        assert_ok(result)
        assert f"board {server.target} over SSH (" in result.stdout
        assert "all 3 comparison(s) PASSED" in result.stdout
        wrong = hb_verifier(["-m", f"{s.quanti},{s.bin}", "-b", server.address, "-u", "root", "-p", "not-it", *local],
                            tmp_path)
        assert_one_error(wrong, "refused SSH authentication", "password")
    finally:
        server.stop()


def test_a_board_list_mixes_ssh_and_grpc_boards(samples, sshd, board, tmp_path):
    s = samples["rgb"]
    boards = tmp_path / "boards.txt"
    boards.write_text(f"# the lab\nssh://{sshd.address}\ngrpc://{board.target}\n")
    result = hb_verifier(["-m", f"{s.quanti},{s.bin}", "-b", f"@{boards}", "-s", "True", "--identity", sshd.user_key,
                          "--known-hosts", sshd.known_hosts, "--remote-command", REMOTE_COMMAND,
                          "--remote-tmp", sshd.remote_tmp], tmp_path)
    assert_ok(result)
    assert f"board {sshd.target} over SSH (" in result.stdout and f"board {board.target} (" in result.stdout
    assert "FAILED" not in result.stdout


@pytest.mark.parametrize("args, flag", [
    (["-b", "grpc://127.0.0.1:1", "-u", "root"], "--username"),
    (["-b", "grpc://127.0.0.1:1", "-p", "secret"], "--password"),
    (["-s", "True", "--identity", "id_key"], "--identity"),
    (["-b", "grpc://127.0.0.1:1", "--remote-tmp", "/data/tmp"], "--remote-tmp"),
    (["-b", "127.0.0.1:22", "--token-file", "board.token"], "--token-file"),
    (["-b", "10.0.0.1", "--tls-ca", "ca.pem"], "--tls-ca"),
    (["-b", "http://10.0.0.1"], "http://10.0.0.1"),
])
def test_a_flag_that_cannot_apply_is_an_error_naming_it(samples, tmp_path, args, flag):
    s = samples["rgb"]
    result = hb_verifier(["-m", f"{s.quanti},{s.bin}", *args], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.output
    assert flag in result.stderr, result.stderr


def test_the_password_environment_variable_is_not_a_typed_flag(samples, tmp_path):
    s = samples["rgb"]
    env = clean_env(BPUEMU_SSH_PASSWORD="secret")
    result = run_cli(["-m", f"{s.quanti},{s.bin}", "-s", "True"], tmp_path, env=env, module="bpuemu.host.cli.hb_verifier")
    assert_ok(result)
