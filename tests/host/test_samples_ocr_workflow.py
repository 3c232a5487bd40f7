"""The OCR sample's workflow, as a user runs it: ``bpuemu-samples copy ocr DIR``, then 01..05 in order.

Small data (OCR_* variables: 4 calibration pages, 8 lines; the detector at
160x160) keeps it near a minute and a half (05_evaluate.sh included); the scripts, yaml files and
defaults are the shipped ones otherwise. Each script must succeed and say
what it did; 04's board is a local hrt_boardd the script starts and stops,
and it must agree with the quantized model exactly on every model.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
from PIL import Image

from bpuemu.host.samples.ocr import dataset, preprocess

BIN = os.path.dirname(sys.executable)
SMALL = {"OCR_DET_SIZE": "160x160", "OCR_CAL_PAGES": "4", "OCR_CAL_LINES": "8", "OCR_EVAL_PAGES": "2",
         "OCR_EVAL_LINES": "4"}


def _run(args, cwd, timeout=600, status=0):
    env = {**os.environ, **SMALL, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    env.pop("BOARD", None)
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == status, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def test_scripts_run_in_order_on_a_fresh_copy(tmp_path):
    sample = tmp_path / "ocr"
    out = _run([os.path.join(BIN, "bpuemu-samples"), "copy", "ocr", str(sample)], cwd=tmp_path)
    assert "copied the ocr sample" in out
    assert {"01_check.sh", "02_preprocess.sh", "03_build.sh", "04_inference.sh", "preprocess.py",
            "ppocr_det_config.yaml", "ppocr_cls_config.yaml", "ppocr_rec_config.yaml"} <= set(os.listdir(sample))

    out = _run(["./04_inference.sh"], cwd=sample, status=1)  # out of order: one line saying what to run
    assert "ERROR model/ch_PP-OCRv4_det_infer.onnx does not exist" in out and "run 01_check.sh first" in out
    assert "started a local board" not in out

    out = _run(["./01_check.sh"], cwd=sample)
    assert out.count("passed; the placement table is in") == 3
    assert sorted(os.listdir(sample / "model")) == sorted(
        ["ch_PP-OCRv4_det_infer.onnx", "ch_ppocr_mobile_v2.0_cls_infer.onnx", "ch_PP-OCRv4_rec_infer.onnx"])

    out = _run(["./02_preprocess.sh", "--read_mode", "skimage"], cwd=sample)
    assert "wrote 4 pages and 8 lines with their labels to data/calibration/" in out
    assert "wrote 8 rec calibration samples (48x320, BGR NCHW uint8) to calibration_data_bgr_rec/" in out
    skimage_files = {d: sorted((sample / d).iterdir()) for d in ("calibration_data_bgr_det", "calibration_data_bgr_rec")}
    skimage_bytes = {d: [p.read_bytes() for p in files] for d, files in skimage_files.items()}
    _run(["./02_preprocess.sh", "--read_mode", "opencv"], cwd=sample)
    for d, files in skimage_files.items():  # the two read modes write the same calibration files
        assert [p.read_bytes() for p in files] == skimage_bytes[d], d
    # and they are the model inputs bpuemu.host.samples.ocr.preprocess makes (rec: the lines upright)
    line = dataset.load_lines(str(sample / "data" / "calibration"))[0]
    rgb = np.asarray(Image.open(line.file).convert("RGB"))
    upright = np.ascontiguousarray(rgb[::-1, ::-1]) if line.angle == 180 else rgb
    pixels = preprocess.rec().pixels(upright)
    assert skimage_bytes["calibration_data_bgr_rec"][0] == pixels[..., ::-1].transpose(2, 0, 1).tobytes()

    out = _run(["./03_build.sh"], cwd=sample)
    assert out.count("== hb_mapper makertbin --config") == 3
    assert len(re.findall(r"^   output \S+: cosine similarity [0-9.]+ ", out, flags=re.M)) == 3, out
    for name in ("det", "cls", "rec"):
        assert (sample / "model_output" / f"ppocr_{name}.bin").is_file()
    assert (sample / "ppocr_det_160x160_config.yaml").is_file()

    out = _run(["./04_inference.sh"], cwd=sample)
    assert re.search(r"started a local board: hrt_boardd on 127\.0\.0\.1:\d+", out)
    assert re.search(r"stopped the local board", out)
    assert out.count("board vs quantized: max |difference| 0\n") == 3, out
    label = re.search(r"== rec: .*\n.*\n   label: (.*)\n", out)
    assert label and f"   float     {label.group(1)}" in out, out

    out = _run(["./05_evaluate.sh", "--no-progress"], cwd=sample)
    assert "no --board: starting 1 hrt_boardd on loopback for this run" in out
    assert "board == quantized on 6 of 6 image(s)" in out, out
    report = json.loads((sample / "eval_report.json").read_text())
    assert set(report["scores"]) == {"float", "quantized", "board"} and report["counts"]["board"] == 6
    again = _run(["./05_evaluate.sh", "--no-progress", "--sides", "float,quantized"], cwd=sample)
    assert "float: 6 of 6 item(s) already in eval_results.jsonl" in again
