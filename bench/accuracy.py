#!/usr/bin/env python3
"""Accuracy benchmark: the OCR sample's PaddleOCR models converted with each calibration method, scored on
held-out data, and compared with the figures recorded in bench/accuracy_results.csv.

    python bench/accuracy.py [--models det,cls,rec] [--methods default,kl,max] [--cal 100] [--held-out 100]
                             [--det-size 320] [--det-cal 20] [--det-held-out 10] [--record]

The models are PP-OCRv4 det, PP-OCR mobile v2.0 cls and PP-OCRv4 rec from the ``rapidocr-onnxruntime``
wheel (``bpuemu.host.samples.ocr.models.fetch``: pip downloads it once into ~/.cache/bpuemu-test-models).
The data is the OCR sample's (``bpuemu.host.samples.ocr.dataset``): the calibration split's lines (cls: as
stored, both orientations; rec: turned upright) and pages (det, fitted into --det-size), and, held out, the
first items of the evaluation split, which calibration never sees.

Each model converts once per calibration method with ``hb_mapper makertbin`` (the sample's yaml, its
``calibration_parameters`` replaced by ``calibration_type: <method>``; the method ``yaml`` keeps the sample's
own). On the held-out items the quantized ONNX (bit-exact with the ``.bin``: hb_verifier, the runtime tests)
and the original float ONNX both run with HB_ONNXRuntime on the same input_type_rt data, as the sample's
evaluation does; the figures are, per model output, the mean and the min over the items of the output's
cosine similarity against the float model (``cos_mean:<output>``, ``cos_min:<output>``), and the task
metric (det: box H-mean at IoU 0.5; cls: direction accuracy; rec: character accuracy and exact match), for
the quantized model and, once per model, the float model (method ``float``). It also checks that each
quantized ONNX loads in a plain ``onnxruntime.InferenceSession(path)`` (``loads_in_stock_onnxruntime``).

The results file holds one row per figure: model, method, metric, value, config (the data sizes: only
figures of the same config are compared), commit, date. Each figure is compared with the newest recorded
one of the same model, method, metric and config: a mean cosine lower by more than 0.001, or a task metric
(or the stock-onnxruntime check) lower at all (by more than 1e-5, the printed precision), is printed as a
REGRESSION naming the commit that recorded the old figure, and the exit status is 1. ``--record`` appends
this run's figures, with the checkout's commit (``-dirty`` when it has uncommitted changes) and today's date.
The default search holds calibration samples out of its statistics from 48 on: --cal below that converts
cls and rec without it.
"""
import argparse
import csv
import datetime
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "accuracy_results.csv")
FIELDS = ("model", "method", "metric", "value", "config", "commit", "date")
MODELS = ("det", "cls", "rec")
METHODS = ("default", "kl", "max")
#: A mean cosine may move this much before it counts as a regression.
COSINE_TOLERANCE = 0.001
#: A task metric (a ratio of counts) lower by more than this is a regression: below the printed precision.
TASK_TOLERANCE = 1e-5
#: The task metrics each model is scored on (keys of bpuemu.host.samples.ocr.metrics.scores).
TASK_METRICS = {"det": ("det_hmean",), "cls": ("cls_accuracy",), "rec": ("rec_char_accuracy", "rec_exact_match")}
STOCK_ORT = "loads_in_stock_onnxruntime"


@dataclass
class Data:
    """The calibration and held-out images of one model."""

    cal: List[np.ndarray]                   # HxWx3 uint8 RGB, what calibration sees
    held: List[np.ndarray]                  # held-out images, as the model gets them
    truth: List[object]                     # per held-out image: the known boxes (det), angle (cls), text (rec)
    page_shapes: List[Tuple[int, int]] = field(default_factory=list)   # det: each held-out page's (H, W)


@dataclass
class Scored:
    model: str
    method: str
    figures: Dict[str, float]               # metric -> value
    chosen: str = ""                        # what the calibration chose (the calibrated model's nodes)
    seconds: float = 0.0


# --- data ---------------------------------------------------------------------------------------

def make_data(work: str, n_cal: int, n_held: int, det_cal: int, det_held: int, seed: int) -> Dict[str, Data]:
    """The OCR sample's calibration and evaluation splits, loaded as arrays per model."""
    from bpuemu.host.samples.ocr import dataset
    from bpuemu.host.samples.ocr.evaluate import load_rgb

    splits = {}
    for split, pages, lines in (("calibration", det_cal, n_cal), ("evaluation", det_held, n_held)):
        splits[split] = dataset.make(os.path.join(work, "data"), seed, pages, lines, split)
    cal_lines = dataset.load_lines(splits["calibration"])
    held_lines = dataset.load_lines(splits["evaluation"])
    cal_pages = dataset.load_pages(splits["calibration"])
    held_pages = dataset.load_pages(splits["evaluation"])
    upright = lambda ln: load_rgb(ln.file)[::-1, ::-1] if ln.angle == 180 else load_rgb(ln.file)  # noqa: E731
    held_page_images = [load_rgb(p.file) for p in held_pages]
    return {
        "det": Data([load_rgb(p.file) for p in cal_pages], held_page_images, [p.boxes for p in held_pages],
                    [im.shape[:2] for im in held_page_images]),
        "cls": Data([load_rgb(ln.file) for ln in cal_lines], [load_rgb(ln.file) for ln in held_lines],
                    [ln.angle for ln in held_lines]),
        "rec": Data([upright(ln) for ln in cal_lines], [upright(ln) for ln in held_lines], [ln.text for ln in held_lines]),
    }


def write_calibration(model_input, images: Sequence[np.ndarray], directory: str) -> str:
    """The calibration files 02_preprocess.sh writes: BGR NCHW uint8 at the model's size, one per image."""
    os.makedirs(directory, exist_ok=True)
    for i, image in enumerate(images):
        bgr = model_input.pixels(image)[..., ::-1]
        np.ascontiguousarray(bgr.transpose(2, 0, 1)).tofile(os.path.join(directory, f"{i:04d}.bgr"))
    return directory


def write_yaml(which: str, float_path: str, method: str, cal_dir: str, work: str, det_size: int) -> str:
    """The sample's yaml for ``which``, converting ``float_path`` from ``cal_dir`` into a working_dir of its own
    with calibration_type ``method`` (``yaml``: the sample's own calibration parameters)."""
    from bpuemu.host.samples import ocr

    with open(os.path.join(os.path.dirname(ocr.__file__), "mapper", f"ppocr_{which}_config.yaml")) as f:
        doc = yaml.safe_load(f)
    doc["model_parameters"].update(onnx_model=float_path, working_dir=os.path.join(work, f"{which}_{method}"),
                                   output_model_file_prefix=f"ppocr_{which}")
    if which == "det":
        doc["input_parameters"]["input_shape"] = f"1x3x{det_size}x{det_size}"
    cal = doc["calibration_parameters"]
    if method != "yaml":
        cal = {"cal_data_type": cal["cal_data_type"], "calibration_type": method}
    cal["cal_data_dir"] = cal_dir
    doc["calibration_parameters"] = cal
    path = os.path.join(work, f"{which}_{method}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


# --- scoring --------------------------------------------------------------------------------------

class Runner:
    """One ONNX model of a conversion run as the OCR sample's evaluation runs it: HB_ONNXRuntime fed the
    ``.bin``'s input_type_rt data."""

    def __init__(self, onnx_path: str, bin_path: str, model_input):
        from bpuemu.common.container import read_bin
        from bpuemu.host import HB_ONNXRuntime

        self.sess = HB_ONNXRuntime(onnx_path)
        self.spec = read_bin(bin_path).model().input_specs[0]
        self.model_input = model_input
        self.output_names = [o.name for o in self.sess.get_outputs()]

    def __call__(self, image: np.ndarray) -> List[np.ndarray]:
        from bpuemu.common.input_types import to_model_input

        rt = self.model_input.rt_input(image)
        return self.sess.run(None, {self.sess.input_names[0]: to_model_input(rt, self.spec)})


def task_scores(which: str, data: Data, outputs: Sequence[Sequence[np.ndarray]], model_input, charset) -> Dict[str, float]:
    """The task metrics of ``which`` from its outputs on the held-out images."""
    from bpuemu.host.samples.ocr import metrics
    from bpuemu.host.samples.ocr.postprocess import cls_direction, ctc_greedy, det_boxes

    det, cls, rec = metrics.DetectionScore(), metrics.CountScore(), metrics.RecognitionScore()
    for k, (outs, truth) in enumerate(zip(outputs, data.truth)):
        if which == "det":
            shape = data.page_shapes[k]
            det.add([b.xyxy for b in det_boxes(outs[0], shape, model_input.ratio(*shape))], truth)
        elif which == "cls":
            cls.add(int(cls_direction(outs[0])[0] == truth))
        else:
            rec.add(ctc_greedy(outs[0], charset)[0], truth)
    got = metrics.scores(det, cls, rec, metrics.CountScore())
    return {k: float(got[k]) for k in TASK_METRICS[which]}


def cosine_figures(reference: Sequence[Sequence[np.ndarray]], outputs: Sequence[Sequence[np.ndarray]],
                   names: Sequence[str]) -> Dict[str, float]:
    """Per output: the mean and the min over the items of its cosine against the float model's."""
    from bpuemu.common.compare import cosine_similarity as cosine

    out = {}
    for k, name in enumerate(names):
        c = [cosine(r[k], o[k]) for r, o in zip(reference, outputs)]
        out[f"cos_mean:{name}"] = float(np.mean(c))
        out[f"cos_min:{name}"] = float(np.min(c))
    return out


def loads_in_stock_onnxruntime(path: str) -> float:
    """1.0 when a plain ``onnxruntime.InferenceSession(path)`` (default options) loads the model, else 0.0."""
    import onnxruntime as ort

    try:
        ort.InferenceSession(path)
    except Exception as exc:  # noqa: BLE001 - any refusal counts, and is printed
        print(f"    stock onnxruntime refuses {os.path.basename(path)}: {str(exc).splitlines()[0][:160]}", flush=True)
        return 0.0
    return 1.0


def chosen_method(calibrated_path: str) -> str:
    """What the calibration chose, read from the calibrated model's HzCalibration nodes."""
    import onnx

    from bpuemu.host.quant import calibration_nodes

    methods, per_channel, asym = set(), False, False
    for n in calibration_nodes(onnx.load(calibrated_path)):
        a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        if a.get("kind") == b"activation" and a.get("method") not in (b"fixed", b"load"):
            methods.add(a["method"].decode())
            per_channel |= "axis" in a
            asym |= any(a.get("zero_points", []))
    return " + ".join([", ".join(sorted(methods)) or "?"] + ["perchannel"] * per_channel + ["asymmetric"] * asym)


def bench_model(which: str, float_path: str, data: Data, methods: Sequence[str], work: str, det_size: int,
                charset, log) -> List[Scored]:
    from bpuemu.host.mapper.makertbin import makertbin_from_config
    from bpuemu.host.samples.ocr import preprocess

    model_input = preprocess.model_inputs((det_size, det_size))[which]
    cal_dir = write_calibration(model_input, data.cal, os.path.join(work, f"{which}_cal"))
    scored: List[Scored] = []
    reference = None
    for method in methods:
        t0 = time.perf_counter()
        art = makertbin_from_config(write_yaml(which, float_path, method, cal_dir, work, det_size))
        if reference is None:
            float_runner = Runner(art.original, art.bin, model_input)
            names = float_runner.output_names
            reference = [float_runner(im) for im in data.held]
            scored.append(Scored(which, "float", task_scores(which, data, reference, model_input, charset)))
        runner = Runner(art.quantized, art.bin, model_input)
        outputs = [runner(im) for im in data.held]
        figures = cosine_figures(reference, outputs, names)
        figures.update(task_scores(which, data, outputs, model_input, charset))
        figures[STOCK_ORT] = loads_in_stock_onnxruntime(art.quantized)
        scored.append(Scored(which, method, figures, chosen_method(art.calibrated), time.perf_counter() - t0))
        log(f"  {which} {method} ({scored[-1].chosen}, {scored[-1].seconds:.1f} s): "
            + ", ".join(f"{k} {v:.5f}" for k, v in figures.items()))
    return scored


# --- the results file -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recorded:
    value: float
    commit: str
    date: str


def read_results(path: str) -> Dict[Tuple[str, str, str, str], Recorded]:
    """(model, method, metric, config) -> the newest recorded figure (the file's last row of it)."""
    out: Dict[Tuple[str, str, str, str], Recorded] = {}
    if not os.path.isfile(path):
        return out
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out[(row["model"], row["method"], row["metric"], row["config"])] = Recorded(float(row["value"]), row["commit"], row["date"])
    return out


def is_regression(metric: str, old: float, new: float) -> bool:
    if metric.startswith("cos_mean:"):
        return new < old - COSINE_TOLERANCE
    if metric.startswith("cos_min:"):
        return False          # the min over a few items is reported, not held to
    return new < old - TASK_TOLERANCE           # a task metric, or the stock-onnxruntime check


def compare(scored: Sequence[Scored], recorded, config: str) -> List[str]:
    """REGRESSION lines for the figures below their recorded ones."""
    lines = []
    for s in scored:
        for metric, value in s.figures.items():
            old = recorded.get((s.model, s.method, metric, config))
            if old is not None and is_regression(metric, old.value, value):
                lines.append(f"REGRESSION {s.model} {s.method} {metric}: {value:.5f}, was {old.value:.5f} "
                             f"recorded at commit {old.commit} ({old.date})")
    return lines


def commit_id() -> str:
    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def record(scored: Sequence[Scored], path: str, config: str) -> None:
    new = not os.path.isfile(path)
    commit, date = commit_id(), datetime.date.today().isoformat()
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(FIELDS)
        for s in scored:
            for metric, value in s.figures.items():
                w.writerow([s.model, s.method, metric, f"{value:.6f}", config, commit, date])


def table(scored: Sequence[Scored], recorded, config: str) -> str:
    """One row per model and method: the first output's mean / min cosine, the task metrics, stock loading,
    and the recorded mean cosine it is compared with."""
    rows = [["model", "method", "chosen", "cos mean / min", "recorded mean (commit)", "task metrics", "stock ORT"]]
    for s in scored:
        mean = next((k for k in s.figures if k.startswith("cos_mean:")), None)
        cos = f"{s.figures[mean]:.5f} / {s.figures['cos_min:' + mean[9:]]:.5f}" if mean else "--"
        old = recorded.get((s.model, s.method, mean, config)) if mean else None
        tasks = ", ".join(f"{k} {100 * s.figures[k]:.2f}%" for k in TASK_METRICS[s.model] if k in s.figures)
        stock = {1.0: "loads", 0.0: "REFUSED"}.get(s.figures.get(STOCK_ORT), "--")
        rows.append([s.model, s.method, s.chosen or "--", cos, f"{old.value:.5f} ({old.commit})" if old else "--", tasks, stock])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--methods", default=",".join(METHODS), help="calibration types, and 'yaml' for the sample's own")
    ap.add_argument("--cal", type=int, default=100, help="calibration lines (cls, rec)")
    ap.add_argument("--held-out", type=int, default=100, help="held-out lines (cls, rec)")
    ap.add_argument("--det-size", type=int, default=320, help="H = W of the detector's input (a multiple of 32)")
    ap.add_argument("--det-cal", type=int, default=20, help="calibration pages (det)")
    ap.add_argument("--det-held-out", type=int, default=10, help="held-out pages (det)")
    ap.add_argument("--seed", type=int, default=0, help="the OCR dataset's seed")
    ap.add_argument("--results", default=RESULTS, help="the results file (CSV)")
    ap.add_argument("--record", action="store_true", help="append this run's figures to the results file")
    args = ap.parse_args(argv)

    logging.basicConfig(level=logging.ERROR)  # makertbin's INFO lines would drown the report
    from bpuemu.host.samples.ocr.models import charset as rec_charset, fetch

    log = lambda s: print(s, flush=True)  # noqa: E731
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if set(models) - set(MODELS):
        ap.error(f"--models: choose from {', '.join(MODELS)}")
    config = (f"cal={args.cal} held={args.held_out} det={args.det_size} det_cal={args.det_cal} "
              f"det_held={args.det_held_out} seed={args.seed}")
    log(f"bpuemu accuracy benchmark: {', '.join(models)} x {', '.join(methods)}; {config}; {os.cpu_count()} CPU(s)")
    t0 = time.perf_counter()
    paths = fetch()
    scored: List[Scored] = []
    with tempfile.TemporaryDirectory(prefix="bpuemu-bench-accuracy-") as work:
        data = make_data(work, args.cal, args.held_out, args.det_cal, args.det_held_out, args.seed)
        charset = rec_charset(paths["rec"])
        for which in models:
            log(f"{which}: {os.path.basename(paths[which])}, {len(data[which].cal)} calibration and "
                f"{len(data[which].held)} held-out items")
            scored += bench_model(which, paths[which], data[which], methods, work, args.det_size, charset, log)
    recorded = read_results(args.results)
    log("")
    log(table(scored, recorded, config))
    regressions = compare(scored, recorded, config)
    for line in regressions:
        log(line)
    if not regressions:
        log("no regression against the recorded figures" if recorded else f"no recorded figures in {args.results}")
    if args.record:
        record(scored, args.results, config)
        log(f"recorded in {args.results} (commit {commit_id()})")
    log(f"total {time.perf_counter() - t0:.0f} s")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
