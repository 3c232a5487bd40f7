"""Repro bundles: hb_verifier --save-repro writes one archive, bpuemu-repro run re-runs it here and on a board and
says per side whether it reproduced bit for bit; a newer or corrupt bundle is one error line. Real daemon on
loopback, real files, the real commands in subprocesses."""
import io
import json
import os
import sys
import tarfile

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "board"))
from boardd_harness import Daemon, assert_ok, assert_one_error, run_cli  # noqa: E402

SIZE = 32


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    from bpuemu.host.samples import sample_bin

    d = tmp_path_factory.mktemp("repro_sample")
    paths = {"bin": str(d / "rgb.bin"), "quanti": str(d / "rgb_quantized_model.onnx")}
    sample_bin(paths["bin"], input_type_rt="rgb", height=SIZE, width=SIZE, quantized_path=paths["quanti"])
    return paths


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    daemon = Daemon(tmp_path_factory.mktemp("repro_boardd")).start()
    try:
        yield daemon
    finally:
        assert daemon.stop() == 0, daemon.log()


def hb_verifier(args, cwd):
    return run_cli(args, cwd, module="bpuemu.host.cli.hb_verifier")


def repro(args, cwd):
    return run_cli(args, cwd, module="bpuemu.host.cli.repro")


@pytest.fixture(scope="module")
def bundle(sample, board, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("repro_run")
    result = hb_verifier(["-m", f"{sample['quanti']},{sample['bin']}", "-s", "True", "-b", f"grpc://{board.target}",
                          "--save-repro", "out"], cwd)
    assert_ok(result)
    (path,) = (cwd / "out").glob("*_repro_*.tar.gz")
    assert f"INFO repro bundle: out/{path.name}" in result.stdout
    return path


def _members(path) -> dict:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def _write(path, files: dict) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_the_bundle_holds_models_inputs_outputs_versions_and_hashes(bundle, sample, board):
    import hashlib

    files = _members(bundle)
    manifest = json.loads(files["manifest.json"])
    assert manifest["bpuemu_repro"] == 1 and manifest["model_name"] and manifest["march"] == "bayes-e"
    assert set(manifest["models"]) == {"bin", "quanti"}
    assert files[f"models/{os.path.basename(sample['bin'])}"] == open(sample["bin"], "rb").read()
    assert [s["kind"] for s in manifest["sides"]] == ["quanti", "sim", "board"]
    facts = manifest["sides"][2]["board"]
    assert facts["address"] == board.target and facts["timing"] == "host" and facts["bpuemu"] and facts["arch"]
    assert manifest["inputs"][0]["shape"] == [1, SIZE, SIZE, 3]
    for name, digest in manifest["files"].items():
        assert hashlib.sha256(files[name]).hexdigest() == digest
    assert set(manifest["files"]) == set(files) - {"manifest.json"}
    assert manifest["report"]["pairs"]


def test_run_reproduces_every_side_here_and_on_the_board(bundle, board, tmp_path):
    result = repro(["run", bundle, "-b", f"grpc://{board.target}"], tmp_path)
    assert_ok(result)
    lines = [ln for ln in result.stdout.splitlines() if "reproduced bit for bit" in ln]
    assert len(lines) == 3, result.stdout
    assert any(ln.startswith(f"board grpc://{board.target} (against the bundle's Arm)") for ln in lines), lines
    assert os.listdir(tmp_path) == []


def test_an_output_that_no_longer_matches_is_named(bundle, tmp_path):
    """A bundle whose saved Sim output was changed (its hash updated to match): the re-run says Sim differs."""
    import hashlib

    files = _members(bundle)
    manifest = json.loads(files["manifest.json"])
    sim = next(s for s in manifest["sides"] if s["kind"] == "sim")
    name = sim["outputs"][0]["file"]
    changed = np.load(io.BytesIO(files[name])).copy()
    changed.flat[0] += 1
    buf = io.BytesIO()
    np.save(buf, changed)
    files[name] = buf.getvalue()
    manifest["files"][name] = hashlib.sha256(files[name]).hexdigest()
    files["manifest.json"] = json.dumps(manifest).encode()
    _write(tmp_path / "changed.tar.gz", files)
    result = repro(["run", tmp_path / "changed.tar.gz"], tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.output
    assert "Quanti.onnx (against the bundle's Quanti.onnx): reproduced bit for bit" in result.stdout
    assert f"Sim (against the bundle's Sim): DIFFERS: output '{sim['outputs'][0]['name']}': 1 of" in result.stdout


def test_a_bundle_from_a_newer_bpuemu_is_refused_with_one_line(bundle, tmp_path):
    files = _members(bundle)
    manifest = json.loads(files["manifest.json"])
    manifest["bpuemu_repro"], manifest["bpuemu"] = 2, "9.0.0"
    files["manifest.json"] = json.dumps(manifest).encode()
    _write(tmp_path / "newer.tar.gz", files)
    line = assert_one_error(repro(["run", tmp_path / "newer.tar.gz"], tmp_path), "newer.tar.gz", "format 2",
                            "bpuemu 9.0.0")
    assert "newer than this bpuemu" in line


@pytest.mark.parametrize("how", ["not_an_archive", "truncated", "hash", "path", "no_manifest"])
def test_a_corrupt_bundle_is_refused_without_a_traceback(bundle, tmp_path, how):
    path = tmp_path / "bad.tar.gz"
    data = open(bundle, "rb").read()
    files = _members(bundle)
    if how == "not_an_archive":
        path.write_bytes(b"hello, not a bundle")
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "hash":
        name = next(n for n in files if n.startswith("inputs/"))
        files[name] = files[name][:-1] + bytes([files[name][-1] ^ 1])
        _write(path, files)
    elif how == "path":
        files["../escape.bin"] = b"x"
        _write(path, files)
    else:
        del files["manifest.json"]
        _write(path, files)
    line = assert_one_error(repro(["run", path], tmp_path), "bad.tar.gz", "not a usable repro bundle")
    assert not (tmp_path.parent / "escape.bin").exists()
    assert line


def test_a_failed_verification_names_save_repro(sample, tmp_path):
    """On a FAIL, hb_verifier's hint names --save-repro; with it, the bundle is written for the failing run."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(sample["quanti"])
    init = next(t for t in m.graph.initializer if numpy_helper.to_array(t).dtype == np.int8 and t.dims and
                numpy_helper.to_array(t).size > 8)
    w = numpy_helper.to_array(init).copy()
    w.reshape(-1)[0] = np.int8(-100 if w.reshape(-1)[0] > 0 else 100)
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    onnx.save(m, tmp_path / "perturbed.onnx")
    args = ["-m", f"{tmp_path / 'perturbed.onnx'},{sample['bin']}", "-s", "True"]
    failed = hb_verifier(args, tmp_path)
    assert failed.returncode == 1 and "FAILED" in failed.stdout
    assert "Hint: add --save-repro DIR" in failed.stdout
    saved = hb_verifier([*args, "--save-repro", "out"], tmp_path)
    assert saved.returncode == 1 and "INFO repro bundle: out/" in saved.stdout and "Hint: add --save-repro" not in saved.stdout
    (path,) = (tmp_path / "out").glob("*.tar.gz")
    result = repro(["run", path], tmp_path)
    assert_ok(result)  # the failure reproduces: both sides give what the bundle holds
    assert result.stdout.count("reproduced bit for bit") == 2
