"""The main job, through the console scripts of a wheel installed in fresh venvs.

This is what a user gets from ``pip install dist/bpuemu-*.whl[host]``: no
editable install, no checkout on sys.path, only the commands on PATH.

    hb_mapper checker -> hb_mapper makertbin -> hrt_boardd (free loopback port)
    -> hrt_model_exec model_info | infer | perf --board -> hb_verifier -s True -b ...

and, in a second venv holding the wheel alone (a board), hrt_boardd and
hrt_model_exec against the ``.bin`` the host made.
"""
import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from helpers.docs import documented_commands

pytestmark = pytest.mark.installed

SIZE = 32  # a small sample CNN: conversion takes seconds
#: hrt_model_exec perf's console lines, as the seed shows them ("Performance Measurement on Development Board").
PERF_LINES = (r"^Running condition:\n  Thread number is: {threads}\n  Frame count   is: {frames}\n"
              r"  Program run time: \d+\.\d+ ms\nPerf result:\n  Frame totally latency is: \d+\.\d+ ms\n"
              r"  Average    latency    is: \d+\.\d+ ms\n  Frame      rate       is: \d+\.\d+ FPS$")


def assert_model_info(out: str) -> None:
    """hrt_model_exec model_info of the sample: one model, its nv12 input data and its float output prob."""
    assert "This model file has 1 model:\n[sample]\n" in out and "[model name]: sample" in out, out
    blocks = {}
    for block in out.split("\n\n"):
        head, *lines = block.strip().splitlines() or [""]
        if re.fullmatch(r"(input|output)\[\d+\]:", head.strip()):
            blocks[head.strip()[:-1]] = dict(line.split(": ", 1) for line in lines if ": " in line)
    assert sorted(blocks) == ["input[0]", "output[0]"], out
    assert {k: blocks["input[0]"].get(k) for k in ("name", "valid shape", "tensor type")} == {
        "name": "data", "valid shape": f"(1,3,{SIZE},{SIZE},)", "tensor type": "HB_DNN_IMG_TYPE_NV12"}, out
    assert {k: blocks["output[0]"].get(k) for k in ("name", "valid shape", "tensor type")} == {
        "name": "prob", "valid shape": "(1,10,)", "tensor type": "HB_DNN_TENSOR_TYPE_F32"}, out


def assert_infer(out: str) -> None:
    """hrt_model_exec infer of the sample: its one output, ten softmax probabilities."""
    assert "infer success: model sample\n" in out, out
    m = re.search(r"^output\[0\]: name: prob, shape: \[1, 10\], dtype: float32, min: (\S+), max: (\S+)$", out, re.M)
    assert m and 0 <= float(m.group(1)) <= float(m.group(2)) <= 1, out


def assert_perf(out: str, threads: int, frames: int) -> None:
    assert re.search(PERF_LINES.format(threads=threads, frames=frames), out, re.M), out


@pytest.fixture(scope="module")
def project(tmp_path_factory, host_venv):
    """A user's project: float model, yaml, calibration data; converted with hb_mapper."""
    from bpuemu.host.samples import write_sample_project  # the user's inputs, not the product under test

    work = tmp_path_factory.mktemp("project")
    config = write_sample_project(str(work), size=SIZE, input_type_rt="nv12", samples=4, prefix="sample")
    checker = host_venv.run("hb_mapper", "checker", "--model-type", "onnx", "--march", "bayes-e",
                            "--model", "sample_float.onnx", "--input-shape", "data", f"1x3x{SIZE}x{SIZE}", cwd=work)
    makertbin = host_venv.run("hb_mapper", "makertbin", "--config", os.path.basename(config), "--model-type", "onnx",
                              cwd=work)
    return {"dir": work, "checker": checker, "makertbin": makertbin,
            "bin": work / "model_output" / "sample.bin", "quanti": work / "model_output" / "sample_quantized_model.onnx"}


class Daemon:
    """hrt_boardd from a venv, on a free loopback port (port 0 + --port-file)."""

    def __init__(self, venv, workdir: pathlib.Path):
        port_file = workdir / "port"
        self.log = open(workdir / "hrt_boardd.log", "w")
        exe = venv.bin / "hrt_boardd"
        self.proc = subprocess.Popen([str(exe), "--listen", "127.0.0.1:0", "--model-dir", str(workdir / "store"),
                                      "--port-file", str(port_file)], cwd=workdir, env=venv.env,
                                     stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert self.proc.poll() is None, (workdir / "hrt_boardd.log").read_text()
            assert time.monotonic() < deadline, "hrt_boardd did not start in 60 s"
            time.sleep(0.05)
        self.target = f"127.0.0.1:{port_file.read_text().strip()}"

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()

    def assert_stops_cleanly(self) -> None:
        """SIGTERM, as systemd stops it: it says it shuts down and exits 0."""
        code = self.stop()
        log = pathlib.Path(self.log.name).read_text()
        assert code == 0 and "hrt_boardd: shutting down" in log, (code, log[-3000:])


@pytest.fixture
def daemon_in(tmp_path):
    started = []

    def start(venv):
        d = Daemon(venv, tmp_path)
        started.append(d)
        return d

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.stop()


def test_every_documented_command_runs_from_the_wheel(host_venv, tmp_path):
    for command in sorted(documented_commands()):
        out = host_venv.run(command, "--help", cwd=tmp_path)
        assert "Usage:" in out.stdout, command


def test_conversion_with_hb_mapper(project):
    assert "End model checking" in project["checker"].stderr
    assert (project["dir"] / "hb_mapper_checker.log").read_text().count("End model checking") == 1
    assert project["bin"].stat().st_size > 0 and project["quanti"].exists()
    log = (project["dir"] / "hb_mapper_makertbin.log").read_text()
    assert "output:" in log
    # The installed script inherits the test run's calibration statistics cache (tests/conftest.py), not ~/.cache.
    entry = re.search(r"calibration statistics (?:stored in|reused from) (\S+\.npz)", log)
    assert entry and pathlib.Path(entry.group(1)).parent.name.startswith("bpuemu-calibration-cache-"), log


def test_j6_conversion_with_hb_compile(host_venv, tmp_path):
    """hb_compile --fast-perf from the wheel: the .hbm, .bc and hb_compile.log; hb_model_info reads the .hbm."""
    import onnx

    from bpuemu.host.samples import sample_float_model  # the user's model, not the product under test

    onnx.save(sample_float_model(SIZE, SIZE, image_input=False), str(tmp_path / "m.onnx"))
    host_venv.run("hb_compile", "--fast-perf", "--model", "m.onnx", "--march", "nash-e", cwd=tmp_path)
    out = tmp_path / "model_output"
    assert (out / "m.hbm").stat().st_size > 0 and (out / "m_quantized_model.bc").stat().st_size > 0
    assert "Convert to runtime hbm file successfully!" in (tmp_path / "hb_compile.log").read_text()
    info = host_venv.run("hb_model_info", str(out / "m.hbm"), cwd=tmp_path)
    assert "BPU march           : nash-e" in info.stdout + info.stderr


def test_j6_walkthrough_from_the_wheel(host_venv, tmp_path):
    """bpuemu-demo --march nash-e (scripts/demo.sh --march nash-e): hb_compile -> .hbm -> hrt_boardd --march
    nash-e -> hrt_model_exec model_info/infer/perf -> hbm_infer == HBRuntime -> hb_verifier PASS."""
    run = host_venv.run("bpuemu-demo", "--march", "nash-e", "--size", "16", "--frame-count", "10",
                        "--workdir", str(tmp_path / "demo"), cwd=tmp_path, timeout=600)
    out = run.stdout + run.stderr
    assert "$ hb_compile --config" in out and (tmp_path / "demo" / "model_output" / "sample_16x16_nv12.hbm").exists()
    assert "$ hrt_boardd --listen 127.0.0.1:0" in out and "--march nash-e &" in out, out
    assert "aligned shape: (1,3,16,32,)" in out, out    # nv12 rows padded to nash-e's 32 bytes
    assert "board vs simulator bit-identical" in out, out
    assert re.search(r"^nash-e model \(J6E; modeled: .*assumed.*\):$", out, re.M), out
    assert "prob: hbm_infer (board) vs HBRuntime (host) bit-identical" in out, out
    assert "Quantized.bc VS Arm" in out and "hb_verifier: all 3 comparison(s) PASSED" in out, out


def test_board_and_verifier_from_the_wheel(host_venv, project, daemon_in, tmp_path):
    daemon = daemon_in(host_venv)
    board = daemon.target
    model = str(project["bin"])
    info = host_venv.run("hrt_model_exec", "model_info", "--model_file", model, "--board", board, cwd=tmp_path)
    assert_model_info(info.stdout)
    infer = host_venv.run("hrt_model_exec", "infer", "--model_file", model, "--enable_dump", "true",
                          "--dump_format", "txt", "--dump_path", "dump", "--board", board, cwd=tmp_path)
    assert_infer(infer.stdout)
    (dump,) = (tmp_path / "dump").glob("*.txt")
    probs = [float(x) for x in dump.read_text().split()]
    assert len(probs) == 10 and abs(sum(probs) - 1) < 1e-3, probs   # the output, as printed
    perf = host_venv.run("hrt_model_exec", "perf", "--model_file", model, "--thread_num", "2", "--frame_count", "20",
                         "--profile_path", ".", "--board", board, cwd=tmp_path)
    assert_perf(perf.stdout, threads=2, frames=20)
    profile = json.loads((tmp_path / "profiler.log").read_text().split("\n***\n")[0])
    assert profile["running_condition"]["model_name"] == "sample" and profile["perf_result"]["FPS"] > 0, profile
    assert (tmp_path / "profiler.csv").read_text().strip()
    verify = host_venv.run("hb_verifier", "-m", f"{project['quanti']},{model}", "-s", "True", "-b", f"grpc://{board}",
                           cwd=tmp_path)
    assert "Strict check PASSED" in verify.stdout and "FAILED" not in verify.stdout
    assert "Arm VS Sim" in verify.stdout
    host_venv.run("hb_verifier", "-m", f"{project['quanti']},{model}", "-s", "True", "-b", f"grpc://{board}",
                  "--save-repro", "repro", cwd=tmp_path)
    (bundle,) = (tmp_path / "repro").glob("*.tar.gz")
    rerun = host_venv.run("bpuemu-repro", "run", str(bundle), "-b", f"grpc://{board}", cwd=tmp_path)
    assert rerun.stdout.count("reproduced bit for bit") == 3, rerun.stdout
    daemon.assert_stops_cleanly()


def test_board_venv_runs_the_bin_without_host_packages(board_venv, project, daemon_in, tmp_path):
    python = str(board_venv.bin / "python")
    for host_only in ("onnx", "paramiko", "yaml", "numba"):
        proc = subprocess.run([python, "-c", f"import {host_only}"], capture_output=True, env=board_venv.env, timeout=60)
        assert proc.returncode != 0, f"{host_only} is installed in the board venv"
    model = str(project["bin"])
    local = board_venv.run("hrt_model_exec", "infer", "--model_file", model, cwd=tmp_path)
    assert_infer(local.stdout)
    daemon = daemon_in(board_venv)
    remote = board_venv.run("hrt_model_exec", "perf", "--model_file", model, "--frame_count", "10",
                            "--board", daemon.target, cwd=tmp_path)
    assert_perf(remote.stdout, threads=1, frames=10)
    info = board_venv.run("hrt_model_exec", "model_info", "--model_file", model, "--board", daemon.target, cwd=tmp_path)
    assert_model_info(info.stdout)
    daemon.assert_stops_cleanly()


def test_seed_evaluation_code_imports_hb_onnxruntime_from_the_wheel(host_venv, project, tmp_path):
    """The seed's evaluation code, as written: ``from horizon_tc_ui import HB_ONNXRuntime``."""
    code = (
        "import numpy as np\n"
        "from horizon_tc_ui import HB_ONNXRuntime\n"
        "import horizon_tc_ui\n"
        "assert 'site-packages' in horizon_tc_ui.__file__, horizon_tc_ui.__file__\n"
        f"sess = HB_ONNXRuntime(model_file={str(project['quanti'])!r})\n"
        "name = sess.input_names[0]\n"
        "shape = [1 if isinstance(d, str) or d is None else d for d in sess.get_inputs()[0].shape]\n"
        "x = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)\n"
        "out = sess.run(sess.output_names, {name: x}, input_offset=128)\n"
        "print(sess.output_names, out[0].shape, float(out[0].sum()))\n"
    )
    out = host_venv.run("python", "-c", code, cwd=tmp_path).stdout
    assert out.startswith("['prob'] (1, 10)"), out
    assert abs(float(out.split()[-1]) - 1.0) < 1e-3  # softmax probabilities


def test_ocr_sample_copies_out_of_the_installed_wheel(host_venv, tmp_path):
    """The OCR sample's scripts, configs and photos are package data: they must come with a non-editable install."""
    out = host_venv.run("bpuemu-samples", "copy", "ocr", str(tmp_path / "ocr"), cwd=tmp_path)
    assert "copied the ocr sample" in out.stdout + out.stderr
    names = set(os.listdir(tmp_path / "ocr"))
    assert {"01_check.sh", "02_preprocess.sh", "03_build.sh", "04_inference.sh", "preprocess.py", "inference.py",
            "ppocr_det_config.yaml", "ppocr_cls_config.yaml", "ppocr_rec_config.yaml"} <= names
    assert all(os.access(tmp_path / "ocr" / n, os.X_OK) for n in names if n.endswith(".sh"))
    made = host_venv.run("python", "-c", "from bpuemu.host.samples.ocr import dataset; "
                         "print(len(dataset.load_pages(dataset.make('data', 0, 2, 2, 'evaluation'))))", cwd=tmp_path)
    assert made.stdout.strip() == "2"  # the photos behind the pages were found in the installed package
