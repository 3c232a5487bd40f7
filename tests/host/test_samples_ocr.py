"""The OCR sample's data side: labelled synthetic pages and lines, the three models' inputs, the model fetch.

The labels are checked against the real float models (rapidocr-onnxruntime
1.4.4's PP-OCRv4 det, mobile v2.0 cls, PP-OCRv4 rec, fetched once and cached):
the recogniser reads the lines' strings, the classifier their orientation, and
the detector's probability map is high inside the pages' boxes and low
outside them. So a wrong box, string, angle or preprocessing shows up here.
"""
import json
import os

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from bpuemu.common.errors import BpuEmuError
from bpuemu.common.input_types import to_model_input
from bpuemu.common.proto import model_pb2
from bpuemu.host.samples.ocr import dataset, models, preprocess
from bpuemu.host.tools.eval_preprocess import preprocess as eval_bytes


@pytest.fixture(scope="module")
def ocr_models():
    return models.fetch()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("ocrdata")
    return out, dataset.make(str(out), seed=3, n_pages=6, n_lines=40, split="evaluation")


def _session(path):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def _ctc(logits, chars):
    table = [""] + chars + [" "]
    ids = logits.argmax(-1)
    return "".join(table[i] for k, i in enumerate(ids) if i and (k == 0 or i != ids[k - 1]))


def _rgb(path):
    return np.asarray(Image.open(path).convert("RGB"))


def test_layout_is_the_contract_and_deterministic_by_seed(data, tmp_path):
    out, split_dir = data
    assert split_dir == os.path.join(str(out), "evaluation")
    pages = json.load(open(os.path.join(split_dir, "pages.json")))
    lines = json.load(open(os.path.join(split_dir, "lines.json")))
    assert [p["file"] for p in pages] == [f"pages/{i:04d}.png" for i in range(6)]
    assert set(lines[0]) == {"file", "text", "angle"} and {ln["angle"] for ln in lines} == {0, 180}
    again = dataset.make(str(tmp_path), seed=3, n_pages=2, n_lines=5, split="evaluation")
    for name in ("pages/0000.png", "pages/0001.png", "lines/0004.png"):  # a smaller set is the larger's start
        assert open(os.path.join(again, name), "rb").read() == open(os.path.join(split_dir, name), "rb").read()
    assert json.load(open(os.path.join(again, "lines.json"))) == lines[:5]
    cal = dataset.make(str(tmp_path), seed=3, n_pages=2, n_lines=5, split="calibration")
    assert json.load(open(os.path.join(cal, "lines.json"))) != lines[:5]
    other = dataset.make(str(tmp_path / "s4"), seed=4, n_pages=0, n_lines=5, split="evaluation")
    assert json.load(open(os.path.join(other, "lines.json"))) != lines[:5]


def test_loaders_give_absolute_files_and_boxes_inside_the_page_without_overlap(data):
    _, split_dir = data
    pages, lines = dataset.load_pages(split_dir), dataset.load_lines(split_dir)
    assert len(pages) == 6 and len(lines) == 40
    for page in pages:
        assert os.path.isabs(page.file) and os.path.isfile(page.file) and len(page.boxes) == len(page.texts) >= 1
        h, w = _rgb(page.file).shape[:2]
        for i, (x0, y0, x1, y1) in enumerate(page.boxes):
            assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
            for (a0, b0, a1, b1) in page.boxes[i + 1:]:
                assert x1 <= a0 or a1 <= x0 or y1 <= b0 or b1 <= y0, "two text lines overlap"
    assert all(os.path.isabs(ln.file) and ln.angle in (0, 180) and ln.text == ln.text.strip() for ln in lines)


def test_every_string_is_in_the_recognisers_charset(data, ocr_models):
    _, split_dir = data
    chars = set(models.charset(ocr_models["rec"])) | {" "}  # PaddleOCR appends the space class
    texts = [ln.text for ln in dataset.load_lines(split_dir)] + [t for p in dataset.load_pages(split_dir)
                                                                for t in p.texts]
    rng = np.random.default_rng(0)
    texts += [dataset.line_text(rng) for _ in range(2000)]
    assert set("".join(texts)) <= chars
    assert not any("  " in t for t in texts)


def test_float_recogniser_and_classifier_read_the_labels(data, ocr_models):
    """rec reads the upright lines' strings (spaces aside: PP-OCRv4 drops some), cls finds the orientation."""
    _, split_dir = data
    chars = models.charset(ocr_models["rec"])
    rec, cls = _session(ocr_models["rec"]), _session(ocr_models["cls"])
    read = oriented = 0
    lines = dataset.load_lines(split_dir)
    for line in lines:
        img = _rgb(line.file)
        probs = cls.run(None, {cls.get_inputs()[0].name: preprocess.cls().float_input(img)})[0][0]
        oriented += (180 if probs[1] > probs[0] else 0) == line.angle
        upright = np.ascontiguousarray(img[::-1, ::-1]) if line.angle == 180 else img
        logits = rec.run(None, {rec.get_inputs()[0].name: preprocess.rec().float_input(upright)})[0][0]
        read += _ctc(logits, chars).replace(" ", "") == line.text.replace(" ", "")
    assert oriented >= 0.9 * len(lines), oriented
    assert read >= 0.85 * len(lines), read


def test_float_detector_fires_inside_the_boxes_and_not_outside(data, ocr_models):
    """Where the detector sees text (probability > 0.3), the boxes are; inside a box, it sees text."""
    _, split_dir = data
    det = _session(ocr_models["det"])
    model = preprocess.det((320, 320))
    inside, text_pixels, covered = [], 0, 0
    for page in dataset.load_pages(split_dir):
        img = _rgb(page.file)
        prob = det.run(None, {det.get_inputs()[0].name: model.float_input(img)})[0][0, 0]
        ry, rx = model.ratio(*img.shape[:2])
        mask = np.zeros(prob.shape, bool)
        for x0, y0, x1, y1 in page.boxes:
            box = (slice(int(y0 * ry), int(np.ceil(y1 * ry))), slice(int(x0 * rx), int(np.ceil(x1 * rx))))
            inside.append(float(prob[box].mean()))
            mask[max(0, int(y0 * ry) - 1):int(y1 * ry) + 2, max(0, int(x0 * rx) - 1):int(x1 * rx) + 2] = True
        text = prob > 0.3
        text_pixels += int(text.sum())
        covered += int((text & mask).sum())
    assert np.median(inside) > 0.4 and covered >= 0.95 * text_pixels, (np.median(inside), covered, text_pixels)


def test_float_input_and_board_bytes_come_from_the_same_pixels(data):
    _, split_dir = data
    line = dataset.load_lines(split_dir)[0]
    for model in (preprocess.rec(), preprocess.cls()):
        rt = model.rt_input(line.file)
        assert rt.shape == (1, model.height, model.width, 3) and rt.dtype == np.uint8  # BGR NHWC
        assert rt.tobytes() == eval_bytes(line.file, model.entry())
        restored = model.float_input(line.file) * np.float32(127.5) + np.float32(127.5)
        assert np.array_equal(np.rint(restored[0]).transpose(1, 2, 0), rt[0])
        assert (rt[0, :, -1] == 127).all() or model.width * _rgb(line.file).shape[0] <= 48 * _rgb(line.file).shape[1]
    page = dataset.load_pages(split_dir)[0]
    det = preprocess.det((320, 320))
    nv12 = det.rt_input(page.file)
    assert nv12.size == 320 * 320 * 3 // 2
    spec = model_pb2.InputSpec(name="x", input_type_rt="nv12", model_shape=[1, 3, 320, 320], model_layout="NCHW")
    yuv = to_model_input(nv12, spec)  # what the board's Preprocess makes of it: Y plane close to the float's luma
    bgr = det.float_input(page.file)[0] * 127.5 + 127.5
    luma = 0.114 * bgr[0] + 0.587 * bgr[1] + 0.299 * bgr[2]
    assert np.abs(yuv[0, 0].astype(np.float32) + 128 - luma).max() <= 1.01


def test_wrong_inputs_are_one_line_errors(tmp_path):
    (tmp_path / "x.onnx").write_bytes(b"not a model")
    with pytest.raises(BpuEmuError):
        models.charset(str(tmp_path / "x.onnx"))
    with pytest.raises(BpuEmuError, match="split 'train'"):
        dataset.make(str(tmp_path), split="train")
    with pytest.raises(BpuEmuError, match="make the data first"):
        dataset.load_lines(str(tmp_path / "nothing"))
    with pytest.raises(BpuEmuError, match="multiples of 32"):
        preprocess.det((300, 320))
