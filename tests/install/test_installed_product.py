"""The main job, through the console scripts of a wheel installed in fresh venvs.

This is what a user gets from ``pip install dist/bpuemu-*.whl[host]``: no
editable install, no checkout on sys.path, only the commands on PATH.

    hb_mapper checker -> hb_mapper makertbin -> hrt_boardd (free loopback port)
    -> hrt_model_exec model_info | infer | perf --board -> hb_verifier -s True -b ...

and, in a second venv holding the wheel alone (a board), hrt_boardd and
hrt_model_exec against the ``.bin`` the host made.
"""
import os
import pathlib
import signal
import subprocess
import time

import pytest

from test_packaging import ROOT, readme_commands

pytestmark = pytest.mark.installed

SIZE = 32  # a small sample CNN: conversion takes seconds


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


def test_every_readme_command_runs_from_the_wheel(host_venv, tmp_path):
    for command in sorted(readme_commands((ROOT / "README.md").read_text())):
        out = host_venv.run(command, "--help", cwd=tmp_path)
        assert "Usage:" in out.stdout, command


def test_conversion_with_hb_mapper(project):
    assert "End model checking" in project["checker"].stderr
    assert (project["dir"] / "hb_mapper_checker.log").read_text().count("End model checking") == 1
    assert project["bin"].stat().st_size > 0 and project["quanti"].exists()
    assert "output:" in (project["dir"] / "hb_mapper_makertbin.log").read_text()


def test_board_and_verifier_from_the_wheel(host_venv, project, daemon_in, tmp_path):
    board = daemon_in(host_venv).target
    model = str(project["bin"])
    info = host_venv.run("hrt_model_exec", "model_info", "--model_file", model, "--board", board, cwd=tmp_path)
    assert "input[0]" in info.stdout or "Input" in info.stdout, info.stdout
    infer = host_venv.run("hrt_model_exec", "infer", "--model_file", model, "--enable_dump", "true",
                          "--dump_format", "txt", "--dump_path", "dump", "--board", board, cwd=tmp_path)
    assert "infer success" in infer.stdout
    assert list((tmp_path / "dump").glob("*.txt"))
    perf = host_venv.run("hrt_model_exec", "perf", "--model_file", model, "--thread_num", "2", "--frame_count", "20",
                         "--profile_path", ".", "--board", board, cwd=tmp_path)
    assert "FPS" in perf.stdout, perf.stdout
    assert (tmp_path / "profiler.log").exists() and (tmp_path / "profiler.csv").exists()
    verify = host_venv.run("hb_verifier", "-m", f"{project['quanti']},{model}", "-s", "True", "-b", f"grpc://{board}",
                           cwd=tmp_path)
    assert "Strict check PASSED" in verify.stdout and "FAILED" not in verify.stdout
    assert "Arm VS Sim" in verify.stdout


def test_board_venv_runs_the_bin_without_host_packages(board_venv, project, daemon_in, tmp_path):
    python = str(board_venv.bin / "python")
    for host_only in ("onnx", "paramiko", "yaml"):
        proc = subprocess.run([python, "-c", f"import {host_only}"], capture_output=True, env=board_venv.env, timeout=60)
        assert proc.returncode != 0, f"{host_only} is installed in the board venv"
    model = str(project["bin"])
    local = board_venv.run("hrt_model_exec", "infer", "--model_file", model, cwd=tmp_path)
    assert "infer success" in local.stdout
    board = daemon_in(board_venv).target
    remote = board_venv.run("hrt_model_exec", "perf", "--model_file", model, "--frame_count", "10", "--board", board,
                            cwd=tmp_path)
    assert "FPS" in remote.stdout
    info = board_venv.run("hrt_model_exec", "model_info", "--model_file", model, "--board", board, cwd=tmp_path)
    assert info.stdout.strip()


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
