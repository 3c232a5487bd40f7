"""The OCR sample's evaluation: task metrics, PP-OCR postprocessing, float vs quantized vs board, farm runs.

Metrics and decoding are checked on hand-made cases with exact values; the
postprocessing on the real PaddleOCR models' outputs; the evaluation command
end to end on converted models against real hrt_boardd daemons on loopback,
including a resumed run and a board SIGKILLed mid-run.
"""
import ast
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bpuemu.host.samples.ocr import dataset, metrics, models, preprocess
from bpuemu.host.samples.ocr.postprocess import (TextBox, cls_direction, components, ctc_greedy, det_boxes,
                                                 turn_over)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "board"))
from boardd_harness import Daemon, clean_env  # noqa: E402

#: The detector at 320x320 keeps the tests' conversions short (the sample builds it at 640x640).
DET_SIZE = (320, 320)
#: How far below the float model's score the quantized model's may be, per metric (fractions).
QUANTIZED_WITHIN = {"det_hmean": 0.10, "cls_accuracy": 0.05, "rec_exact_match": 0.10, "rec_char_accuracy": 0.03,
                    "e2e_accuracy": 0.15}
#: Of the evaluation split's 24 lines, how many the quantized recogniser may read differently from the float one.
MAX_LINES_READ_DIFFERENTLY = 3


# --- metrics, exact values ---------------------------------------------------------------

def test_iou_and_one_to_one_matching():
    assert metrics.iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert metrics.iou((0, 0, 10, 10), (10, 0, 20, 10)) == 0.0
    assert metrics.iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    # two predictions over one known box: only the better one matches
    assert metrics.match_boxes([(0, 0, 10, 10), (1, 0, 10, 10)], [(1, 0, 10, 10)]) == [(1, 0)]
    # IoU exactly 0.5 matches, just under does not
    assert metrics.match_boxes([(0, 0, 10, 10)], [(0, 0, 10, 20)]) == [(0, 0)]
    assert metrics.match_boxes([(0, 0, 10, 10)], [(0, 0, 10, 21)]) == []


def test_detection_precision_recall_hmean():
    s = metrics.DetectionScore()
    s.add([(0, 0, 10, 10), (20, 0, 30, 10), (50, 50, 60, 60)], [(0, 0, 10, 10), (21, 0, 30, 10)])
    s.add([], [(0, 0, 5, 5)])
    assert (s.matched, s.predicted, s.known) == (2, 3, 3)
    assert s.precision == pytest.approx(2 / 3) and s.recall == pytest.approx(2 / 3)
    assert s.hmean == pytest.approx(2 / 3)
    s.add([(0, 0, 5, 5)], [])
    assert s.precision == pytest.approx(2 / 4) and s.hmean == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))


def test_recognition_exact_match_and_character_accuracy():
    assert metrics.edit_distance("kitten", "sitting") == 3
    assert metrics.edit_distance("", "abc") == 3 and metrics.edit_distance("abc", "abc") == 0
    s = metrics.RecognitionScore()
    s.add("hello", "hello")
    s.add(" board ", "board")       # spaces at the ends do not count
    s.add("quamt", "quant")         # 1 edit
    s.add("12", "12345")            # 3 edits
    assert s.exact_match == pytest.approx(2 / 4)
    assert s.char_accuracy == pytest.approx(1 - 4 / 20)
    worse = metrics.RecognitionScore()
    worse.add("a much longer wrong line", "ab")
    assert worse.char_accuracy == 0.0  # floored


def test_results_file_refuses_a_whole_json_line_that_is_not_a_result(tmp_path):
    """A line that parses as JSON but is no result (a list, a number, an unknown side) is refused with its
    line number and the file is left as it was; only a line cut short is dropped. A last result whose
    newline a crash kept from being written is resumed, and the next result starts a line of its own."""
    from bpuemu.common.errors import InvalidInput
    from bpuemu.host.samples.ocr.evaluate import ResultsFile

    path, fp = tmp_path / "r.jsonl", "f" * 64
    first = {"key": "lines/0000.png", "pred": {"angle": 0, "text": "Milk"}, "digest": "d0"}
    after = {"side": "float", "key": "lines/0002.png", "pred": {"angle": 0, "text": "Tea"}, "digest": "d2"}
    store = ResultsFile(str(path), fp)
    store.add("float", dict(first))
    store.close()
    good = path.read_bytes()
    for bad in ('[1, 2]', '42', '"lines/0001.png"', 'null', '{"side": "cpu", "key": "k", "pred": {}}',
                '{"side": "float", "pred": {}}'):
        content = good + bad.encode() + b"\n" + json.dumps(after).encode() + b"\n"
        path.write_bytes(content)
        with pytest.raises(InvalidInput, match=r"r\.jsonl line 3 is not an OCR evaluation result"):
            ResultsFile(str(path), fp)
        assert path.read_bytes() == content   # nothing truncated
    # a torn last line is still dropped and redone
    path.write_bytes(good + json.dumps(after).encode()[:20])
    store = ResultsFile(str(path), fp)
    assert list(store.done["float"]) == ["lines/0000.png"]
    store.close()
    assert path.read_bytes() == good
    # a whole last result without its newline: kept, and the next one goes on its own line
    path.write_bytes(good.rstrip(b"\n"))
    store = ResultsFile(str(path), fp)
    assert list(store.done["float"]) == ["lines/0000.png"]
    store.add("float", {k: v for k, v in after.items() if k != "side"})
    store.close()
    again = ResultsFile(str(path), fp)
    assert sorted(again.done["float"]) == ["lines/0000.png", "lines/0002.png"]
    again.close()


def test_lines_read_differently_from_float_without_the_labels():
    """Quantized vs float on the recogniser: lines both sides have, texts compared with their ends stripped;
    pages and lines only one side has are left out."""
    from bpuemu.host.samples.ocr.evaluate import Item, read_differently

    items = [Item("page", "/p.png", "pages/0000.png"), Item("line", "/a.png", "lines/0000.png", text="Tea 603"),
             Item("line", "/b.png", "lines/0001.png", text="Milk"), Item("line", "/c.png", "lines/0002.png", text="x")]
    float_ = {"pages/0000.png": {"pred": {"texts": ["a"]}}, "lines/0000.png": {"pred": {"text": " Tea 603"}},
              "lines/0001.png": {"pred": {"text": "Milk"}}}
    quantized = {"pages/0000.png": {"pred": {"texts": ["b"]}}, "lines/0000.png": {"pred": {"text": "Tea 603 "}},
                 "lines/0001.png": {"pred": {"text": "Mik"}}, "lines/0002.png": {"pred": {"text": "x"}}}
    assert read_differently(items, float_, quantized) == {"compared": 2, "differ": ["lines/0001.png"]}
    quantized["lines/0000.png"]["pred"]["text"] = "Tea603"
    assert read_differently(items, float_, quantized)["differ"] == ["lines/0000.png", "lines/0001.png"]


def test_end_to_end_lines_read_and_scores():
    known_boxes, known_texts = [(0, 0, 100, 20), (0, 40, 100, 60), (0, 80, 100, 100)], ["one", "two", "three"]
    predicted = [((0, 0, 100, 20), "one"), ((0, 41, 100, 60), "tw0"), ((0, 80, 100, 100), "three "),
                 ((200, 0, 300, 20), "one")]
    assert metrics.lines_read(predicted, known_boxes, known_texts) == 2
    e2e, cls = metrics.CountScore(), metrics.CountScore()
    e2e.add(2, 3)
    cls.add(1)
    cls.add(0)
    out = metrics.scores(metrics.DetectionScore(), cls, metrics.RecognitionScore(), e2e)
    assert out == {"cls_accuracy": 0.5, "e2e_accuracy": pytest.approx(2 / 3)}


# --- postprocessing on hand-made outputs ---------------------------------------------------

def test_components_are_8_connected():
    m = np.zeros((8, 10), dtype=bool)
    m[1, 1:3] = True
    m[2, 3] = True          # diagonal neighbour of (1, 2): same component
    m[5, 5:9] = True
    m[6, 4] = True          # diagonal below-left of (5, 5)
    m[4, 0] = True          # alone
    assert components(m) == [(1, 1, 3, 2), (0, 4, 0, 4), (4, 5, 8, 6)]


def test_db_boxes_threshold_score_and_unclip():
    prob = np.zeros((40, 40), dtype=np.float32)
    prob[10:15, 5:25] = 0.9     # a line: after the 2x2 dilation rows 10..15, cols 5..25
    prob[30:34, 5:30] = 0.35    # above thresh, below box_thresh: dropped
    prob[2, 30:32] = 0.9        # too small: dropped
    boxes = det_boxes(prob[None, None], (40, 40))
    # w=20, h=5 between pixel centres; score 5*20*0.9 / (6*21); d = 100*1.6/50 = 3.2
    assert boxes == [TextBox(2, 7, 28, 18, pytest.approx(90 / 126))]
    # scaled to a page twice as large
    assert det_boxes(prob, (80, 80))[0].xyxy == (4, 14, 56, 36)


def test_cls_direction_and_ctc_greedy():
    assert cls_direction(np.array([[0.2, 0.8]])) == (180, pytest.approx(0.8))
    assert cls_direction(np.array([[0.95, 0.05]])) == (0, pytest.approx(0.95))
    assert turn_over(180, 0.95) and not turn_over(180, 0.8) and not turn_over(0, 0.99)
    charset = ["a", "b"]   # classes: blank, a, b, space
    steps = [1, 1, 0, 1, 2, 2, 3, 0, 2]
    logits = np.full((1, len(steps), 4), 0.1, dtype=np.float32)
    logits[0, np.arange(len(steps)), steps] = 0.7
    assert ctc_greedy(logits, charset) == ("aab b", pytest.approx(0.7))
    with pytest.raises(ValueError):
        ctc_greedy(logits, ["a"])


# --- the real models ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ppocr():
    """The three PP-OCR ONNX models from the RapidOCR wheel (fetched once, cached, never committed)."""
    return models.fetch()


def test_postprocess_reads_real_model_outputs(tmp_path, ppocr):
    """The float models as PaddleOCR runs them; the decoders find the known boxes, directions and strings."""
    import onnxruntime as ort

    from bpuemu.host.samples.ocr.evaluate import load_rgb

    split = dataset.make(str(tmp_path), seed=5, n_pages=3, n_lines=12, split="evaluation")
    sess = {k: ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for k, p in ppocr.items()}
    chars = models.charset(ppocr["rec"])
    assert len(chars) == 6623 and "a" in chars
    inputs = preprocess.model_inputs((640, 640))
    det = metrics.DetectionScore()
    for p in dataset.load_pages(split):
        img = load_rgb(p.file)
        prob = sess["det"].run(None, {"x": inputs["det"].float_input(img)})[0]
        det.add([b.xyxy for b in det_boxes(prob, img.shape[:2], inputs["det"].ratio(*img.shape[:2]))], p.boxes)
    assert det.known >= 6 and det.hmean >= 0.9, det
    rec, cls = metrics.RecognitionScore(), metrics.CountScore()
    for ln in dataset.load_lines(split):
        img = load_rgb(ln.file)
        angle, _ = cls_direction(sess["cls"].run(None, {"x": inputs["cls"].float_input(img)})[0])
        cls.add(int(angle == ln.angle))
        upright = img[::-1, ::-1] if ln.angle == 180 else img
        rec.add(ctc_greedy(sess["rec"].run(None, {"x": inputs["rec"].float_input(upright)})[0], chars)[0], ln.text)
    assert cls.accuracy >= 11 / 12, cls
    # the float recogniser misreads a character now and then, as PaddleOCR does on such lines
    assert rec.exact >= 10 and rec.char_accuracy >= 0.97, rec


# --- the evaluation end to end -------------------------------------------------------------------

def _convert(ppocr, which: str, model_input, cal_images, out_dir: str, calibration: str) -> str:
    """makertbin on the real model: the sample's input type at run time, PaddleOCR's normalisation in the yaml."""
    from makertbin_helpers import write_cal_dir, write_config

    from bpuemu.host.mapper.makertbin import makertbin_from_config

    h, w = model_input.height, model_input.width
    cal = write_cal_dir(os.path.join(out_dir, f"{which}_cal"),  # BGR NCHW uint8, the input_type_train layout
                        [model_input.pixels(img)[..., ::-1].transpose(2, 0, 1)[None] for img in cal_images])
    rt = {"input_type_rt": model_input.input_type_rt}
    if model_input.input_type_rt != "nv12":
        rt["input_layout_rt"] = "NHWC"
    cfg = write_config(
        os.path.join(out_dir, f"{which}.yaml"), ppocr[which], which, os.path.join(out_dir, which),
        {"x": {"input_type_train": "bgr", "input_layout_train": "NCHW", **rt, "norm_type": "data_mean_and_scale",
               "mean_value": "127.5 127.5 127.5", "scale_value": "0.007843137", "input_shape": f"1x3x{h}x{w}",
               "cal_data_dir": cal, "cal_data_type": "uint8"}},
        calibration={"calibration_type": calibration})
    makertbin_from_config(cfg)
    return os.path.join(out_dir, which)


def _sample_yaml(which: str) -> dict:
    """The OCR sample's shipped makertbin yaml for ``which`` (det, cls or rec)."""
    import yaml

    import bpuemu.host.samples.ocr as sample

    with open(os.path.join(os.path.dirname(sample.__file__), "mapper", f"ppocr_{which}_config.yaml")) as f:
        return yaml.safe_load(f)


def _convert_with_the_sample_yaml(ppocr, which: str, model_input, cal_images, out_dir: str) -> str:
    """makertbin with the OCR sample's own yaml (as ``bpuemu-samples copy ocr`` ships it: its
    calibration and optimization settings and its input settings), only its paths pointed at this test's files."""
    import yaml
    from makertbin_helpers import write_cal_dir

    from bpuemu.host.mapper.makertbin import makertbin_from_config

    doc = _sample_yaml(which)
    doc["model_parameters"].update(onnx_model=ppocr[which], working_dir=os.path.join(out_dir, which),
                                   output_model_file_prefix=which)
    doc["calibration_parameters"]["cal_data_dir"] = write_cal_dir(
        os.path.join(out_dir, f"{which}_cal"), [model_input.pixels(img)[..., ::-1].transpose(2, 0, 1)[None] for img in cal_images])
    cfg = os.path.join(out_dir, f"{which}.yaml")
    with open(cfg, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    makertbin_from_config(cfg)
    return os.path.join(out_dir, which)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, ppocr):
    """The three models converted on a calibration split, and an evaluation split of 3 pages and 24 lines."""
    from bpuemu.host.samples.ocr.evaluate import load_rgb

    root = str(tmp_path_factory.mktemp("ocr"))
    cal = dataset.make(root, seed=11, n_pages=6, n_lines=12, split="calibration")
    ev = dataset.make(root, seed=11, n_pages=3, n_lines=24, split="evaluation")
    pages = [load_rgb(p.file) for p in dataset.load_pages(cal)]
    lines = [load_rgb(ln.file) for ln in dataset.load_lines(cal)]   # both directions, for cls
    upright = [img[::-1, ::-1] if ln.angle == 180 else img for img, ln in zip(lines, dataset.load_lines(cal))]
    inputs = preprocess.model_inputs(DET_SIZE)
    # det with calibration_type max (one calibration pass: the conversion stays short); cls and rec with
    # the sample's own yaml files: cls's default search, rec's int16 activations and max-percentile
    dirs = {"det": _convert(ppocr, "det", inputs["det"], pages, root, "max"),
            "cls": _convert_with_the_sample_yaml(ppocr, "cls", inputs["cls"], lines, root),
            "rec": _convert_with_the_sample_yaml(ppocr, "rec", inputs["rec"], upright, root)}
    assert _sample_yaml("cls")["calibration_parameters"]["calibration_type"] == "default"
    return ev, dirs


def _eval_cmd(ev, dirs, *args):
    return [sys.executable, "-m", "bpuemu.host.cli.ocr_eval", "--data", ev, "--det", dirs["det"],
            "--cls", dirs["cls"], "--rec", dirs["rec"], "--no-progress", *map(str, args)]


def _run(cmd, cwd, timeout=300):
    return subprocess.run(cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)


def _records(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return rows[0], rows[1:]


@pytest.fixture(scope="module")
def full_run(converted, tmp_path_factory):
    """float, quantized and board over the whole evaluation split, through the command, on its default
    board: an hrt_boardd it starts on loopback for the run."""
    ev, dirs = converted
    cwd = tmp_path_factory.mktemp("run")
    proc = _run(_eval_cmd(ev, dirs, "--results", cwd / "r.jsonl", "--report", cwd / "report.json"), cwd)
    return proc, cwd


@pytest.mark.timeout(900)  # the module's conversions run in this test's setup
def test_evaluation_reports_float_quantized_board(full_run):
    proc, cwd = full_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "no --board: starting 1 hrt_boardd on loopback for this run" in proc.stdout
    assert "$ hrt_boardd --listen 127.0.0.1:0" in proc.stdout
    report = json.load(open(cwd / "report.json"))
    keys = [k for k, _ in metrics.METRICS]
    for side in ("float", "quantized", "board"):
        assert sorted(report["scores"][side]) == sorted(keys), report["scores"]
        assert report["counts"][side] == 27
    # the float pipeline reads the pages (the detector at 320x320 draws its boxes wider than the
    # labels' ink boxes, so fewer reach IoU 0.5 than at the sample's 640x640; see the real-model test)
    print(proc.stdout)
    assert report["scores"]["float"]["det_hmean"] >= 0.4
    assert report["scores"]["float"]["cls_accuracy"] >= 0.9
    assert report["scores"]["float"]["rec_char_accuracy"] >= 0.95
    # the quantized models read about what the float ones read: each score within its bound of float's,
    # and few lines read differently (the bounds hold for int8 calibrations, not for a broken one)
    float_scores, quantized = report["scores"]["float"], report["scores"]["quantized"]
    for key, bound in QUANTIZED_WITHIN.items():
        assert quantized[key] >= float_scores[key] - bound, (key, quantized, float_scores)
    assert report["scores"]["board"] == report["scores"]["quantized"]
    assert report["agreement"] == {"compared": 27, "identical": 27, "differ": []}
    assert "board == quantized on 27 of 27 image(s)" in proc.stdout
    differ = report["read_differently"]
    assert differ["compared"] == 24 and set(differ["differ"]) <= {f"lines/{i:04d}.png" for i in range(24)}
    assert len(differ["differ"]) <= MAX_LINES_READ_DIFFERENTLY, differ
    assert f"quantized reads {len(differ['differ'])} of 24 line(s) differently from float" in proc.stdout
    for label in ("detection H-mean", "direction accuracy", "recognition character accuracy",
                  "end-to-end text accuracy"):
        assert label in proc.stdout
    header, rows = _records(cwd / "r.jsonl")
    assert header["bpuemu_ocr_eval"] == 1
    assert len(rows) == 3 * 27 and len({(r["side"], r["key"]) for r in rows}) == 3 * 27
    assert [b["items"] for b in report["boards"]] == [27]


def test_rerun_resumes_from_the_results_file(full_run, converted, tmp_path):
    """A re-run does only what the file lacks; a line a crash cut short is redone; other models are refused."""
    proc, cwd = full_run
    ev, dirs = converted
    header, rows = _records(cwd / "r.jsonl")
    kept = [r for r in rows if r["side"] != "board"] + [r for r in rows if r["side"] == "board"][:20]
    with open(tmp_path / "r.jsonl", "w") as f:
        for r in [header] + kept:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.write(json.dumps(rows[-1])[:25])   # torn by a crash
    daemon = Daemon(tmp_path / "board").start()
    try:
        again = _run(_eval_cmd(ev, dirs, "--board", daemon.target, "--results", tmp_path / "r.jsonl",
                               "--report", tmp_path / "report.json"), tmp_path)
    finally:
        daemon.stop()
    assert again.returncode == 0, again.stdout + again.stderr
    assert "board: 20 of 27 item(s) already in" in again.stdout and "running the other 7" in again.stdout
    assert "float: 27 of 27" in again.stdout
    report = json.load(open(tmp_path / "report.json"))
    assert report["boards"][0]["items"] == 7
    assert report["scores"] == json.load(open(cwd / "report.json"))["scores"]
    _, rows2 = _records(tmp_path / "r.jsonl")
    assert len(rows2) == 3 * 27
    # results of other models are refused, not mixed in
    other = json.loads(open(tmp_path / "r.jsonl").readline())
    other["fingerprint"] = "0" * 64
    with open(tmp_path / "other.jsonl", "w") as f:
        f.write(json.dumps(other) + "\n")
    refused = _run(_eval_cmd(ev, dirs, "--sides", "float", "--results", tmp_path / "other.jsonl"), tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("ERROR ") and "other models or data" in refused.stderr


def test_board_killed_mid_run_costs_only_its_in_flight_images(full_run, converted, tmp_path):
    """Two boards; one is SIGKILLed after its first results: the other finishes every image, all still exact.

    Board B is paused (SIGSTOP) once both boards have served, until A has done three images and is
    killed: on a loaded machine B could otherwise finish every image before A did three, and the
    run would end before the kill (B's paused call is far inside the client's 120 s infer deadline).
    """
    _, cwd = full_run
    ev, dirs = converted
    header, rows = _records(cwd / "r.jsonl")
    with open(tmp_path / "r.jsonl", "w") as f:   # float and quantized already done
        for r in [header] + [r for r in rows if r["side"] != "board"]:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    a, b = Daemon(tmp_path / "a").start(), Daemon(tmp_path / "b").start()

    def done(board):
        return sum(1 for r in _records(tmp_path / "r.jsonl")[1] if r.get("worker") == board.target)

    paused = False
    try:
        proc = subprocess.Popen(_eval_cmd(ev, dirs, "--board", f"{a.target},{b.target}", "--results",
                                          tmp_path / "r.jsonl", "--report", tmp_path / "report.json"),
                                cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        done_a = 0
        while time.monotonic() < deadline and proc.poll() is None:
            if not paused and done(b) >= 1:
                b.proc.send_signal(signal.SIGSTOP)
                paused, a_at_pause = True, done(a)
            if paused and done(a) >= a_at_pause + 3:
                break
            time.sleep(0.05)
        done_a = done(a)
        a.kill()
        if paused:
            b.proc.send_signal(signal.SIGCONT)
            paused = False
        out, err = proc.communicate(timeout=240)
    finally:
        if paused:
            b.proc.send_signal(signal.SIGCONT)
        a.kill()
        b.stop()
    assert done_a >= 3, out + err
    assert proc.returncode == 0, out + err
    report = json.load(open(tmp_path / "report.json"))
    by_board = {x["board"]: x for x in report["boards"]}
    assert by_board[a.target]["error"] and not by_board[b.target]["error"]
    assert by_board[a.target]["items"] + by_board[b.target]["items"] == 27
    assert report["agreement"]["identical"] == 27
    _, rows2 = _records(tmp_path / "r.jsonl")
    board_rows = [r for r in rows2 if r["side"] == "board"]
    assert len(board_rows) == len({r["key"] for r in board_rows}) == 27
    assert f"board {a.target}:" in out and "left the run" in out


@pytest.mark.timeout(600)
def test_evaluation_over_namespaced_boards_behind_links(full_run, converted, tmp_path):
    """The board side over four boards each in its own network namespace behind a link (bench/netlab.py: wifi,
    bad, lan whose link goes down for 4 s mid-run, lan): the run finishes with every image read as on one local
    board, and reports per board the images it served and its time per image."""
    from helpers.netboards import lab

    _, cwd = full_run
    ev, dirs = converted
    header, rows = _records(cwd / "r.jsonl")
    local_board = {r["key"]: r["pred"] for r in rows if r["side"] == "board"}
    with open(tmp_path / "r.jsonl", "w") as f:   # float and quantized already done
        for r in [header] + [r for r in rows if r["side"] != "board"]:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with lab(["wifi", "bad", "lan", "lan"], tmp_path / "netlab") as net:
        down, targets = net.boards[2], [b.target for b in net.boards]

        def served(board):
            return sum(1 for r in _records(tmp_path / "r.jsonl")[1] if r.get("worker") == board.target)

        proc = subprocess.Popen(_eval_cmd(ev, dirs, "--board", ",".join(b.target for b in net.boards), "--results",
                                          tmp_path / "r.jsonl", "--report", tmp_path / "report.json"),
                                cwd=tmp_path, env=clean_env(BPUEMU_TOKEN=net.token), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and served(down) < 1:
            time.sleep(0.05)
        net.down(down, 4.0)
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err
    assert "Traceback" not in err
    report = json.load(open(tmp_path / "report.json"))
    assert report["agreement"] == {"compared": 27, "identical": 27, "differ": []}
    _, rows2 = _records(tmp_path / "r.jsonl")
    board_rows = {r["key"]: r["pred"] for r in rows2 if r["side"] == "board"}
    assert board_rows == local_board  # what one local board read, image for image
    by_board = {b["board"]: b for b in report["boards"]}
    assert sorted(by_board) == sorted(targets)
    assert sum(b["items"] for b in by_board.values()) == 27 and by_board[down.target]["items"] >= 1
    for target in targets:
        line = next(ln for ln in out.splitlines() if ln.startswith(f"board {target}:"))
        assert " image(s), " in line and " ms per image)" in line, line
    print(out)


def test_sample_postprocess_script_decodes_dumped_outputs(tmp_path, ppocr):
    """mapper/postprocess.py on outputs written as hrt_model_exec --enable_dump writes them (raw float32)."""
    import onnxruntime as ort

    from bpuemu.host.samples.ocr.evaluate import load_rgb

    split = dataset.make(str(tmp_path), seed=9, n_pages=0, n_lines=1, split="evaluation")
    line = dataset.load_lines(split)[0]
    img = load_rgb(line.file)
    upright = img[::-1, ::-1] if line.angle == 180 else img
    inputs = preprocess.model_inputs()
    rec = ort.InferenceSession(ppocr["rec"], providers=["CPUExecutionProvider"])
    rec.run(None, {"x": inputs["rec"].float_input(upright)})[0].astype(np.float32).tofile(tmp_path / "rec.bin")
    cls = ort.InferenceSession(ppocr["cls"], providers=["CPUExecutionProvider"])
    cls.run(None, {"x": inputs["cls"].float_input(img)})[0].astype(np.float32).tofile(tmp_path / "cls.bin")
    script = os.path.join(os.path.dirname(preprocess.__file__), "mapper", "postprocess.py")
    out = _run([sys.executable, script, "rec", tmp_path / "rec.bin", "--rec_model", ppocr["rec"]], tmp_path)
    assert out.returncode == 0, out.stderr
    assert ast.literal_eval(out.stdout.rsplit(" (confidence", 1)[0]).strip() == line.text, (line.text, out.stdout)
    out = _run([sys.executable, script, "cls", tmp_path / "cls.bin"], tmp_path)
    assert out.returncode == 0 and out.stdout.startswith(f"{line.angle} degrees"), out.stdout + out.stderr
    out = _run([sys.executable, script, "det", tmp_path / "cls.bin", "--page", line.file], tmp_path)
    assert out.returncode == 1 and out.stderr.startswith("ERROR ") and "probability map" in out.stderr
