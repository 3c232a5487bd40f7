"""Nothing lost: a failed, interrupted or killed run keeps the previous run's outputs byte-identical.

makertbin runs as a real subprocess; ``BPUEMU_TEST_STOP_AT`` makes it stop
itself (SIGSTOP) at a named point of the run, where the test SIGKILLs it.
"""
import hashlib
import os
import signal
import subprocess
import sys

import pytest
import yaml

from makertbin_helpers import sample_project

ARTIFACTS = ("_original_float_model.onnx", "_optimized_float_model.onnx", "_calibrated_model.onnx",
             "_quantized_model.onnx", ".bin")


def _mapper_cmd(cfg):
    return [sys.executable, "-m", "bpuemu.host.cli.hb_mapper", "makertbin", "--config", str(cfg), "--model-type", "onnx"]


def _digests(directory):
    """sha256 of every file in ``directory`` and below, hidden staging/cache entries apart."""
    out = {}
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            p = os.path.join(root, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A project converted once (debug dump on), and its outputs' digests."""
    tmp = tmp_path_factory.mktemp("atomic")
    cfg, _ = sample_project(tmp, "rgb", "NHWC", samples=3)
    doc = yaml.safe_load(open(cfg))
    doc["model_parameters"]["debug_mode"] = "dump_calibration_data"
    yaml.safe_dump(doc, open(cfg, "w"))
    run = subprocess.run(_mapper_cmd(cfg), cwd=tmp, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = tmp / "model_output"
    before = _digests(out)
    assert {f"sample{s}" for s in ARTIFACTS} <= set(before)
    assert any(k.startswith("calibration_data/") for k in before)
    return tmp, cfg, out, before


def _second_config(tmp, cfg):
    """The same project with another calibration (so every later artifact would differ)."""
    doc = yaml.safe_load(open(cfg))
    doc["calibration_parameters"]["calibration_type"] = "max"
    path = tmp / "second.yaml"
    yaml.safe_dump(doc, open(path, "w"))
    return path


def _stop_and_kill(cmd, cwd, point):
    proc = subprocess.Popen(cmd, cwd=cwd, env=dict(os.environ, BPUEMU_TEST_STOP_AT=point),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), f"makertbin ended before {point}"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    return proc


@pytest.mark.parametrize("point", ["makertbin:calibrated", "makertbin:compiling", "makertbin:converted"])
def test_sigkill_keeps_the_previous_artifacts_byte_identical(converted, point):
    tmp, cfg, out, before = converted
    _stop_and_kill(_mapper_cmd(_second_config(tmp, cfg)), tmp, point)
    assert _digests(out) == before
    leftovers = [e for e in os.listdir(out) if e.startswith(".makertbin-")]
    assert len(leftovers) == 1  # the killed run's staging directory, nothing beside the artifacts

    # The next run (here: one that fails at calibration) removes the killed run's staging directory and says so.
    run = subprocess.run(_mapper_cmd(_bad_cal_config(tmp, cfg)), cwd=tmp, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "the partial outputs of a run that was killed" in run.stderr
    assert [e for e in os.listdir(out) if e.startswith(".makertbin-")] == []
    assert _digests(out) == before


def _bad_cal_config(tmp, cfg):
    """The project pointed at a calibration directory holding one file of the wrong size."""
    bad_cal = tmp / "bad_cal"
    bad_cal.mkdir(exist_ok=True)
    (bad_cal / "0000.bin").write_bytes(b"\0" * 100)
    doc = yaml.safe_load(open(cfg))
    doc["calibration_parameters"]["cal_data_dir"] = str(bad_cal)
    path = tmp / "bad_cal.yaml"
    yaml.safe_dump(doc, open(path, "w"))
    return path


def test_a_bad_calibration_file_keeps_the_last_good_model_and_says_so(converted):
    tmp, cfg, out, before = converted
    run = subprocess.run(_mapper_cmd(_bad_cal_config(tmp, cfg)), cwd=tmp, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "makertbin failed: its partial outputs in" in run.stderr and "were removed" in run.stderr
    assert _digests(out) == before
    assert sorted(e for e in os.listdir(out) if e.startswith(".") and e != ".hb_mapper_cache") == []


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl_c", "sigterm"])
def test_ctrl_c_or_sigterm_during_compile_keeps_the_previous_artifacts(converted, sig, code):
    tmp, cfg, out, before = converted
    proc = subprocess.Popen(_mapper_cmd(_second_config(tmp, cfg)), cwd=tmp, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, BPUEMU_TEST_STOP_AT="makertbin:compiling"))
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status)
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "makertbin interrupted: its partial outputs in" in err and "were removed" in err
    assert _digests(out) == before
    assert [e for e in os.listdir(out) if e.startswith(".makertbin-")] == []


def test_sigkill_while_publishing_is_completed_by_the_next_run(tmp_path):
    cfg, _ = sample_project(tmp_path, "rgb", "NHWC", samples=2)
    run = subprocess.run(_mapper_cmd(cfg), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = tmp_path / "model_output"
    before = _digests(out)
    second = _second_config(tmp_path, cfg)
    _stop_and_kill(_mapper_cmd(second), tmp_path, "makertbin:publishing")
    mixed = _digests(out)
    assert mixed["sample.bin"] != before["sample.bin"]  # killed after the first rename (sample.bin) ...
    assert mixed["sample_quantized_model.onnx"] == before["sample_quantized_model.onnx"]  # ... before the others

    from bpuemu.common.atomic import recover_stale

    assert len(recover_stale(out)) == 1
    recovered = _digests(out)
    # The same conversion run to the end gives exactly the rolled-forward files.
    run = subprocess.run(_mapper_cmd(second), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert recovered == _digests(out)
    assert recovered["sample_quantized_model.onnx"] != before["sample_quantized_model.onnx"]


def test_hb_perf_killed_before_publishing_keeps_the_old_result_folder(tmp_path):
    from bpuemu.host.samples import sample_bin

    sample_bin(str(tmp_path / "m.bin"), height=16, width=16)
    cmd = [sys.executable, "-c", "from bpuemu.host.cli.hb_perf import main; main()", "m.bin"]
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    result = tmp_path / "hb_perf_result"
    before = _digests(result)
    assert len(before) >= 4
    _stop_and_kill(cmd + ["--ddr-bandwidth", "0.01"], tmp_path, "hb_perf:publish")
    assert _digests(result) == before
    run = subprocess.run(cmd + ["--ddr-bandwidth", "0.01"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    after = _digests(result)
    assert after.keys() == before.keys() and after != before
    assert [e for e in os.listdir(result) if e.startswith(".")] == []
