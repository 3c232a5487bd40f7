#!/usr/bin/env python3
"""Conversion benchmark: bpuemu ``hb_mapper makertbin`` against onnxruntime's ``quantize_static``.

    python bench/convert.py [--samples 100] [--held-out 16] [--rounds 5] [--det-size 160]
                            [--models sample,cls,det]

On the same float models and the same calibration samples (synthetic text
pages, ``bpuemu.host.samples.text_image``), in ONE run, it prints two
comparisons, each with its goal (issue 3):

1. Wall time and memory: makertbin (the whole ``makertbin_from_config``, as
   a user runs it: reading the calibration files, HzPreprocess, optimizer,
   placement, calibration, the quantized and calibrated models, the cosine
   table, compiling and writing the .bin) with ``calibration_type: default``
   (the seed's default, what almost every user runs) and with ``max``, against
   ``onnxruntime.quantization.quantize_static`` (QDQ, per-channel, QInt8
   activations and weights) with MinMax and with Entropy, fed the same samples
   as the normalised float tensors the float model takes, from memory. Goals:
   default / MinMax <= 1.0 and max / MinMax <= 1.0; makertbin default's peak
   RSS <= MinMax's. onnxruntime gets its model prepared outside the timed
   call, as its docs ask (onnx.version_converter to opset 13 -- per-channel
   DequantizeLinear needs it --, the input shape fixed,
   ``quant_pre_process(skip_symbolic_shape=True)``); that one-off preparation
   time is printed but not counted. Every timed run is a forked child of the
   bench (its wall time and its own peak RSS, ``ru_maxrss``; the bench's own
   RSS at fork time is in every figure and printed); after one untimed run of
   each kind (first-call costs), the sides alternate over --rounds rounds,
   each makertbin run in a fresh working_dir (no O3 compile cache), and the
   medians are compared (the machine is shared and noisy). ``--sides``
   chooses what runs; ``--timing-only`` skips part 2. With the default side
   it also prints the exact statistics' cost a sample (run, ranges,
   histogram) and its floor on this machine against MinMax's wall
   (``statistics_floor``, ``floor_line``).
2. Quality: the output cosine similarity of makertbin's
   ``calibration_type: default`` quantized model against the best of
   onnxruntime's MinMax / Entropy / Percentile x per_channel True/False (QDQ,
   QInt8, otherwise its defaults). Every quantized model runs with the board
   runtime's session options (``session_options()``: QDQ fusion off, as the
   runtime runs the .bin, see DESIGN.md) on --held-out pages that are NOT in
   the calibration set; the cosine is taken per page against the float model's
   output, and the mean and the min over the pages are reported. Goal: ours
   >= theirs (mean) on every model. When ours is lower, the run also converts
   the default search's step-3 candidate (max-percentile 0.99995 + perchannel +
   asymmetric, as a user would set it in the yaml) and prints its figures.

Notes on onnxruntime's side (1.32): quant_pre_process matters (without it,
MinMax on the classifier scored 0.89 instead of 0.97, as BN and Paddle's
Constant weights stay unfolded); quantize_static's Entropy keeps its
calibrator's defaults of 128 histogram bins and 128 quantized bins (its
extra_options cannot change them), so it lands on (nearly) the MinMax range;
its activations are asymmetric, so a ReLU output gets all 255 levels where
the X5 default search's first two steps use symmetric int8. Its calibration
session uses onnxruntime's default thread pool (every core) while makertbin's
run with the board runtime's options (one intra-op thread): on a busy machine
that is a wash, on an idle one it gives onnxruntime the second core.

Models: the sample CNN of ``write_sample_project`` (224x224, RGB), and
PaddleOCR's text-direction classifier (1x3x48x192) and PP-OCRv4 text detector
(1x3xSxS, --det-size) from the ``rapidocr-onnxruntime==1.4.4`` wheel (BGR NCHW,
mean 127.5, scale 1/127.5), fetched with ``pip download --no-deps`` into
~/.cache/bpuemu-test-models as the tests do. Both sides read the same pages:
makertbin as raw uint8 NCHW files in its cal_data_dir, with input_type_rt equal
to input_type_train so that the runtime input is the page itself.

A full run (three models, 100 samples, 5 rounds, det at 160x160) takes a few minutes on a
2-core machine and peaks at about 5 GB of memory (onnxruntime's calibrators keep every
intermediate tensor of every sample); --det-size 320 and up needs far more (18 GB at 320).

Each makertbin side also prints where its wall time went: per stage, the median over the rounds of
makertbin's own stage clock (``Artifacts.stages``, logged as ``time by stage: ...``; ``stages_line``):
statistics, search, cosine table, emit/compile and the rest, each with the cores it kept busy (CPU /
wall) and the CPU seconds spent inside onnxruntime's runs (``onnxruntime_clock``); a second line puts
those runs alone, spread over the cores without a gap, against MinMax's whole wall time
(``runs_line``): what the conversion cannot go below with the runs it makes. The table's ratio cells
give, in brackets, the lowest and highest of the rounds' own ratios (``round_spread``).

The ``default-rerun`` side is what a user tuning the yaml waits for from the second conversion on:
makertbin default with the calibration statistics cache (``host/quant/statcache.py``) holding this
model's statistics on these samples (its untimed warm-up run stored them); every other makertbin side
runs with ``BPUEMU_CALIBRATION_CACHE=off`` and computes them, as a first conversion does. Each rerun
still has its own working_dir (no O3 compile cache).

Latest figure (bench/RESULTS.md has every run, with its date, commit and machine):
``--models det --det-size 640 --samples 100 --rounds 3 --timing-only --sides
default,default-rerun,MinMax``: default / MinMax 1.06 [0.89-1.07], default-rerun 0.39-0.41.
"""
import argparse
import contextlib
import io
import logging
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import onnx
import yaml

from bpuemu.common.compare import cosine_similarity as cosine

PADDLE_FILES = {"cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx", "det": "ch_PP-OCRv4_det_infer.onnx"}
ORT_METHODS = ("MinMax", "Entropy", "Percentile")
#: calibration_parameters of the default search's step-3 candidate, as a user would set them in the yaml.
STEP3 = {"max_percentile": 0.99995, "per_channel": True, "optimization": "asymmetric"}
#: What step 1 times: makertbin with calibration_type default and max, quantize_static MinMax and Entropy,
#: and makertbin default converting again with the calibration statistics cached (a user tuning the yaml).
SIDES = ("default", "default-rerun", "max", "MinMax", "Entropy")


@dataclass
class Case:
    """One model, its yaml for makertbin and the pages both sides see."""

    name: str
    float_path: str
    input_name: str
    color: str                        # input_type_train: "rgb" | "bgr"
    height: int
    width: int
    mean: np.ndarray                  # per channel, in the train color order
    scale: np.ndarray
    cal_pages: List[np.ndarray]       # HxWx3 uint8 RGB
    held_pages: List[np.ndarray]
    yaml_path: str = ""

    def nchw_uint8(self, page: np.ndarray) -> np.ndarray:
        px = page[..., ::-1] if self.color == "bgr" else page
        return np.ascontiguousarray(px.transpose(2, 0, 1)[None])

    def normalised(self, page: np.ndarray) -> np.ndarray:
        x = self.nchw_uint8(page).astype(np.float32)
        return ((x - self.mean.reshape(1, 3, 1, 1)) * self.scale.reshape(1, 3, 1, 1)).astype(np.float32)


# --- setting up the models and data --------------------------------------------------------------

def paddle_models() -> Dict[str, str]:
    """The wheel's cls and det, fetched and cached by the OCR sample's fetch."""
    from bpuemu.host.samples.ocr.models import fetch

    fetched = fetch()
    return {name: fetched[name] for name in PADDLE_FILES}


def pages(h: int, w: int, count: int, seed: int) -> List[np.ndarray]:
    from bpuemu.host.samples import text_image

    rng = np.random.default_rng(seed)
    return [text_image(h, w, rng) for _ in range(count)]


def write_yaml(case: Case, work: str, calibration_type: str, cal_dir: str, run: str = "",
               calibration: Optional[dict] = None) -> str:
    """A makertbin yaml; each ``run`` gets its own working_dir, so no run reuses another's O3 compile cache."""
    inp = {
        "input_name": case.input_name, "input_type_train": case.color, "input_layout_train": "NCHW",
        "input_type_rt": case.color, "input_layout_rt": "NCHW", "norm_type": "data_mean_and_scale",
        "mean_value": " ".join(f"{v:g}" for v in case.mean), "scale_value": " ".join(f"{v:.9g}" for v in case.scale),
        "input_shape": f"1x3x{case.height}x{case.width}",
    }
    doc = {
        "model_parameters": {"onnx_model": case.float_path, "march": "bayes-e",
                             "output_model_file_prefix": f"{case.name}_{calibration_type}",
                             "working_dir": os.path.join(work, f"{case.name}_{calibration_type}{run}")},
        "input_parameters": inp,
        "calibration_parameters": {"cal_data_dir": cal_dir, "cal_data_type": "uint8", "calibration_type": calibration_type,
                                   **(calibration or {})},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3"},
    }
    path = os.path.join(work, f"{case.name}_{calibration_type}{run}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def write_cal_dir(case: Case, work: str) -> str:
    d = os.path.join(work, f"{case.name}_cal")
    os.makedirs(d, exist_ok=True)
    for i, p in enumerate(case.cal_pages):
        case.nchw_uint8(p).tofile(os.path.join(d, f"{i:04d}.{case.color}"))
    return d


def make_cases(names: List[str], work: str, n_cal: int, n_held: int, det_size: int) -> List[Case]:
    from bpuemu.host.samples import MEAN, SCALE, write_sample_project

    cases = []
    for name in names:
        if name == "sample":
            # The sample project's own model (its yaml is rewritten below to read the bench's pages).
            write_sample_project(os.path.join(work, "sample_project"), 224, "rgb", samples=1)
            path = os.path.join(work, "sample_project", "sample_float.onnx")
            case = Case("sample", path, "data", "rgb", 224, 224, MEAN.astype(np.float32),
                        np.full(3, SCALE, np.float32), pages(224, 224, n_cal, 0), pages(224, 224, n_held, 1000))
        elif name in PADDLE_FILES:
            h, w = (48, 192) if name == "cls" else (det_size, det_size)
            case = Case(name, paddle_models()[name], "x", "bgr", h, w, np.full(3, 127.5, np.float32),
                        np.full(3, 1 / 127.5, np.float32), pages(h, w, n_cal, 7), pages(h, w, n_held, 1007))
        else:
            raise SystemExit(f"unknown model {name!r}; choose from sample, cls, det")
        cases.append(case)
    return cases


# --- onnxruntime's side ----------------------------------------------------------------------------

class _Reader:
    """onnxruntime CalibrationDataReader over in-memory feeds."""

    def __init__(self, feeds):
        self.feeds = feeds
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):
        self._it = iter(self.feeds)


def ort_prepare(case: Case, work: str) -> Tuple[str, float]:
    """The float model at opset 13 with the input shape fixed, through quant_pre_process."""
    from onnx import version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    t0 = time.perf_counter()
    m = onnx.load(case.float_path)
    if next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) < 13:
        m = version_converter.convert_version(m, 13)
    for vi in m.graph.input:
        if vi.name == case.input_name:
            for d, v in zip(vi.type.tensor_type.shape.dim, (1, 3, case.height, case.width)):
                d.ClearField("dim_param")
                d.dim_value = v
    del m.graph.value_info[:]
    m = onnx.shape_inference.infer_shapes(m)
    fixed = os.path.join(work, f"{case.name}_ort_fixed.onnx")
    onnx.save(m, fixed)
    out = os.path.join(work, f"{case.name}_ort_prepared.onnx")
    quant_pre_process(fixed, out, skip_symbolic_shape=True)
    return out, time.perf_counter() - t0


def ort_quantize(prepared: str, out: str, feeds, method: str, per_channel: bool) -> float:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    reader = _Reader(feeds)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # its calibrators print progress
        quantize_static(prepared, out, reader, quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=getattr(CalibrationMethod, method))
    return time.perf_counter() - t0


# --- measuring ------------------------------------------------------------------------------------

def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def held_out_cosines(case: Case, run_quantized: Callable[[np.ndarray], np.ndarray]) -> List[float]:
    """Per held-out page: the first output's cosine against the float model."""
    import onnxruntime as ort

    fsess = ort.InferenceSession(case.float_path, providers=["CPUExecutionProvider"])
    out = []
    for page in case.held_pages:
        ref = fsess.run(None, {case.input_name: case.normalised(page)})[0]
        out.append(cosine(ref, run_quantized(page)))
    return out


def ours_runner(case: Case, quantized_path: str) -> Callable[[np.ndarray], np.ndarray]:
    from bpuemu.host import HB_ONNXRuntime  # session_options(): QDQ fusion off

    sess = HB_ONNXRuntime(quantized_path)
    # input_type_rt == input_type_train, NCHW: the runtime input is the page; uint8 -> X_128 is the seed's -128.
    return lambda page: sess.run(None, {case.input_name: case.nchw_uint8(page)})[0]


def ort_runner(case: Case, quantized_path: str) -> Callable[[np.ndarray], np.ndarray]:
    import onnxruntime as ort

    from bpuemu.board.runtime.sessions import session_options

    sess = ort.InferenceSession(quantized_path, sess_options=session_options(), providers=["CPUExecutionProvider"])
    return lambda page: sess.run(None, {case.input_name: case.normalised(page)})[0]


def timed_makertbin(yaml_path: str, statistics_cache: str = "off"):
    """makertbin as a user runs it; ``statistics_cache``: the calibration statistics cache directory
    (BPUEMU_CALIBRATION_CACHE), ``off`` for a conversion that computes them (the first one).
    Returns (artifacts, wall seconds, onnxruntime CPU seconds per stage: ``onnxruntime_clock``)."""
    from bpuemu.host.mapper.makertbin import makertbin_from_config
    from bpuemu.host.quant.statcache import ENV

    os.environ[ENV] = statistics_cache
    with onnxruntime_clock() as ort_cpu:
        t0 = time.perf_counter()
        art = makertbin_from_config(yaml_path)
        wall = time.perf_counter() - t0
    return art, wall, dict(ort_cpu)


@contextlib.contextmanager
def onnxruntime_clock():
    """Per makertbin stage (``StageClock``'s innermost open one; "the rest" outside them), the CPU
    seconds spent inside onnxruntime's ``Session.run``: each run's thread CPU time (the board's
    session options run a model on the calling thread, one intra-op thread), summed over the
    threads that run. What is left of a stage's CPU is bpuemu's own: the statistics' kernels, the
    cosines, building models, Python. Costs two clock reads a run."""
    from onnxruntime.capi.onnxruntime_inference_collection import Session

    from bpuemu.host.quant.stages import StageClock

    spent: Dict[str, float] = {}
    open_: List[str] = []
    run, stage = Session.run, StageClock.stage

    def timed_run(self, *args, **kwargs):
        t0 = time.thread_time()
        try:
            return run(self, *args, **kwargs)
        finally:
            name = open_[-1] if open_ else "the rest"
            spent[name] = spent.get(name, 0.0) + time.thread_time() - t0

    @contextlib.contextmanager
    def tracked(self, name):
        open_.append(name)
        try:
            with stage(self, name):
                yield
        finally:
            open_.pop()

    Session.run, StageClock.stage = timed_run, tracked
    try:
        yield spent
    finally:
        Session.run, StageClock.stage = run, stage


def in_child(fn: Callable[[], object], result: Optional[list] = None) -> Tuple[float, float]:
    """(wall seconds, peak RSS in MB) of ``fn()`` run in a forked child: each side's memory
    peak is its own (a child's ru_maxrss), and no side inherits the other's caches or threads.
    ``result``: a list that gets ``fn()``'s (picklable) return value appended."""
    import multiprocessing
    import resource

    def child(conn):
        t0 = time.perf_counter()
        try:
            value = fn()
            conn.send((time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, None,
                       value if result is not None else None))
        except BaseException as exc:  # reported by the parent
            conn.send((0.0, 0.0, f"{type(exc).__name__}: {exc}", None))

    ctx = multiprocessing.get_context("fork")
    parent, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child, args=(child_end,))
    proc.start()
    child_end.close()
    wall, rss, err, value = parent.recv()
    proc.join()
    if err:
        raise RuntimeError(f"the measured side failed: {err}")
    if result is not None:
        result.append(value)
    return wall, rss


def _stages_of(value) -> Optional[Dict[str, Tuple[float, float, float]]]:
    """A makertbin side's (artifacts, seconds, onnxruntime CPU per stage) -> per stage (wall, CPU,
    onnxruntime's CPU) seconds (``Artifacts.stages``, ``onnxruntime_clock``); None for onnxruntime's side."""
    if isinstance(value, tuple) and hasattr(value[0], "stages"):
        return {name: (w, c, value[2].get(name, 0.0)) for name, (w, c) in value[0].stages.items()}
    return None


def median_stages(runs: List[Dict[str, Tuple[float, ...]]]) -> Dict[str, Tuple[float, ...]]:
    """Per stage, the median of each figure (wall, CPU, onnxruntime's CPU seconds) over the rounds' runs."""
    return {name: tuple(statistics.median(r[name][k] for r in runs) for k in range(len(runs[0][name])))
            for name in runs[0]}


def stages_line(side: str, stages: Dict[str, Tuple[float, ...]], runs: int) -> str:
    """Where a makertbin side's wall time went: per stage (bpuemu.host.quant.stages), the median wall
    and CPU seconds of ``runs`` runs, the cores the stage kept busy (CPU / wall) and the CPU seconds
    spent in onnxruntime's runs."""
    cells = [f"{name} {w:.2f} s ({c / w if w > 0 else 0:.2f} cores; CPU {c:.1f} s, onnxruntime's runs {o:.1f})"
             for name, (w, c, o) in stages.items()]
    return (f"{side} by stage (median of {runs}, wall and CPU / wall): " + ", ".join(cells)
            + f"; sum {sum(st[0] for st in stages.values()):.2f} s")


def runs_line(side: str, stages: Dict[str, Tuple[float, ...]], minmax_wall: float, cores: int) -> str:
    """A makertbin side's onnxruntime runs alone (``onnxruntime_clock``, every stage) spread over
    ``cores`` without a gap, against onnxruntime MinMax's whole wall time: what the conversion cannot
    go below with the runs it makes, before its own kernels, cosines and model building."""
    ort = sum(st[2] for st in stages.values())
    cpu = sum(st[1] for st in stages.values())
    return (f"{side}: onnxruntime's runs {ort:.1f} of its {cpu:.1f} CPU s; alone over {cores} cores {ort / cores:.1f} s "
            f"= {ort / cores / minmax_wall:.2f} x MinMax's whole {minmax_wall:.1f} s (the rest of its CPU "
            f"over {cores} cores: {(cpu - ort) / cores:.1f} s)")


class _Captured(Exception):
    """Stops a makertbin run once the calibration statistics' inputs are known."""


def statistics_floor(yaml_path: str, measured: int = 8) -> Dict[str, float]:
    """What the exact calibration statistics cost on this machine, per sample, in CPU seconds.

    makertbin (calibration_type default) runs until the calibration asks for its statistics; with
    what it asks for (the plan's float model, the tensors, the calibration feeds), one thread
    times on the first ``measured`` samples (after one untimed run, which also loads the compiled
    kernels): the float model's run with every one of those tensors as an output (``run``, one
    whole session, no parts), the range reduction (``ranges``: min, max, per-channel min/max) and
    the 2048-bin histogram counting (``hist``), both as the statistics compute them
    (``statistics._Accumulator``, ``bpuemu.host.quant.kernels``). Exact statistics need the
    ranges before the histogram (its bins span [0, absmax] of all samples), so two runs per
    sample: the floor is ``samples x (2 x run + ranges + hist) / cores``; one run per sample
    would be the floor of a one-pass histogram that is no longer exact.
    """
    import bpuemu.host.quant.api as qapi
    from bpuemu.host.onnxgraph import feed_for, open_session, with_outputs
    from bpuemu.host.quant.statcache import ENV
    from bpuemu.host.quant.statistics import TensorStats, _Accumulator

    captured = {}

    def capture(model, tensors, samples, infos, bins, **_):
        captured.update(model=model, tensors=list(dict.fromkeys(tensors)), samples=list(samples), infos=infos, bins=bins)
        raise _Captured

    from bpuemu.host.mapper.makertbin import makertbin_from_config

    qapi.cached_statistics, original = capture, qapi.cached_statistics
    os.environ[ENV] = "off"
    try:
        makertbin_from_config(yaml_path)
        raise RuntimeError("makertbin did not ask for calibration statistics")
    except _Captured:
        pass
    finally:
        qapi.cached_statistics = original
    samples = captured["samples"]
    names = [t for t in captured["tensors"] if t not in samples[0]]
    sess = open_session(with_outputs(captured["model"], names, captured["infos"]))
    accs = {t: _Accumulator(captured["bins"], compiled=True) for t in names}
    k = max(1, min(measured, len(samples)))
    feeds = [feed_for(sess, s) for s in samples[:k]]
    first = sess.run(names, feeds[0])                   # first-call costs, untimed
    accs[names[0]].range_of(first[0])                   # the kernels compiled or read from numba's cache
    TensorStats.of(first[0], compiled=True)
    del first
    run = ranges = hist = 0.0
    values = 0
    for feed in feeds:
        t0 = time.process_time()
        outs = sess.run(names, feed)
        t1 = time.process_time()
        for t, x in zip(names, outs):
            accs[t].add_range(accs[t].range_of(x))
        run, ranges = run + t1 - t0, ranges + time.process_time() - t1
        values = sum(x.size for x in outs)
        del outs
    for feed in feeds:
        t0 = time.process_time()
        outs = sess.run(names, feed)
        t1 = time.process_time()
        for t, x in zip(names, outs):
            accs[t].hist_of(x)
        run, hist = run + t1 - t0, hist + time.process_time() - t1
        del outs
    return {"run": run / (2 * k), "ranges": ranges / k, "hist": hist / k, "measured": k,
            "samples": len(samples), "tensors": len(names), "values": values}


def floor_line(floor: Dict[str, float], minmax_wall: float, cores: int) -> str:
    """The exact statistics' cost per sample, and its floor on ``cores`` against onnxruntime MinMax's whole
    wall time (see statistics_floor)."""
    n = floor["samples"]
    two = n * (2 * floor["run"] + floor["ranges"] + floor["hist"]) / cores
    one = n * (floor["run"] + floor["ranges"] + floor["hist"]) / cores
    return (f"exact statistics' cost ({floor['tensors']} tensors, {floor['values'] / 1e6:.0f} M values a sample; CPU s a "
            f"sample over {floor['measured']} samples, one thread): run with every tensor out {floor['run']:.3f}, "
            f"ranges {floor['ranges']:.3f}, histogram {floor['hist']:.3f} (compiled kernels); its floor x {n} samples / "
            f"{cores} cores: two runs a "
            f"sample (exact) {two:.1f} s = {two / minmax_wall:.2f} x MinMax's whole {minmax_wall:.1f} s; one run a "
            f"sample {one:.1f} s = {one / minmax_wall:.2f} x; the statistics alone, before the search, the cosine "
            f"table and the compile")


@dataclass
class Result:
    name: str
    ours_mean: float
    ours_min: float
    ours_method: str
    ort_best: str
    ort_mean: float
    ort_min: float
    ours_time: float
    ort_time: float
    ort_prep: float
    default_time: float
    ort_all: Dict[str, Tuple[float, float]]
    wall: Dict[str, float]            # median wall time per side: default, max, MinMax, Entropy
    peak_mb: Dict[str, float]         # peak RSS per side
    note: str = ""
    floor: Optional[Dict[str, float]] = None    # statistics_floor(), when the default side ran
    #: makertbin side -> stage -> median (wall s, CPU s, onnxruntime's CPU s) over the rounds (``median_stages``)
    stages: Dict[str, Dict[str, Tuple[float, ...]]] = field(default_factory=dict)
    rounds: int = 0
    #: side -> its wall time in each round (the sides alternate within a round)
    round_walls: Dict[str, List[float]] = field(default_factory=dict)

    @property
    def default_ratio(self) -> float:
        return self.wall["default"] / self.wall["MinMax"]

    @property
    def ratio(self) -> float:
        return self.ours_time / self.ort_time

    @property
    def goals(self) -> str:
        bad = []
        if self.ratio > 1.0:
            bad.append("time max")
        if "default" in self.wall and self.default_ratio > 1.0:
            bad.append("time default")
        if "default" in self.peak_mb and self.peak_mb["default"] > self.peak_mb["MinMax"]:
            bad.append("memory")
        if self.ours_mean < self.ort_mean:
            bad.append("cosine")
        return "met" if not bad else "NOT met (" + ", ".join(bad) + ")"


def bench_case(case: Case, work: str, rounds: int, log: Callable[[str], None], wanted=SIDES, timing_only=False) -> Result:
    cal_dir = write_cal_dir(case, work)
    yaml_default = write_yaml(case, work, "default", cal_dir)
    prepared, prep_time = ort_prepare(case, work)
    feeds = [{case.input_name: case.normalised(p)} for p in case.cal_pages]

    # 1. wall time and memory peak, each run in a forked child, the sides alternating after one
    #    untimed run of each (imports, first-call costs).
    minmax_pc = os.path.join(work, f"{case.name}_ort_MinMax_pc.onnx")
    entropy_pc = os.path.join(work, f"{case.name}_ort_Entropy_pc.onnx")
    # default-rerun converts with a calibration statistics cache that its (untimed) warm-up run filled.
    cache = os.path.join(work, f"{case.name}_calibration_cache")
    sides = {
        "default": lambda r: timed_makertbin(write_yaml(case, work, "default", cal_dir, f"_round{r}")),
        "default-rerun": lambda r: timed_makertbin(write_yaml(case, work, "default", cal_dir, f"_rerun{r}"), cache),
        "max": lambda r: timed_makertbin(write_yaml(case, work, "max", cal_dir, f"_round{r}")),
        "MinMax": lambda r: ort_quantize(prepared, minmax_pc, feeds, "MinMax", True),
        "Entropy": lambda r: ort_quantize(prepared, entropy_pc, feeds, "Entropy", True),
    }
    sides = {k: v for k, v in sides.items() if k in wanted}
    wall: Dict[str, List[float]] = {k: [] for k in sides}
    peak: Dict[str, float] = {k: 0.0 for k in sides}
    staged: Dict[str, List[Dict[str, Tuple[float, ...]]]] = {k: [] for k in sides}
    in_child(lambda: sides[next(k for k in ("default-rerun", "default", "max") if k in sides)]("_warmup"))
    in_child(lambda: sides["MinMax"]("_warmup"))
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(list(sides)))
        for side in order:
            got: list = []
            t, rss = in_child(lambda: _stages_of(sides[side](r)), got)
            wall[side].append(t)
            peak[side] = max(peak[side], rss)
            if got[0]:
                staged[side].append(got[0])
        log(f"  {case.name} round {r + 1}/{rounds}: " + ", ".join(f"{k} {wall[k][-1]:.2f} s" for k in sides))
    medians = {k: statistics.median(v) for k, v in wall.items()}
    stages = {k: median_stages(v) for k, v in staged.items() if v}
    for side, st in stages.items():
        log(f"  {case.name} {stages_line(side, st, len(staged[side]))}")
        log(f"  {case.name} {runs_line(side, st, medians['MinMax'], _cores())}")
    floor = None
    if "default" in sides:
        got: list = []
        in_child(lambda: statistics_floor(write_yaml(case, work, "default", cal_dir, "_floor")), got)
        floor = got[0]
        log(f"  {case.name}: {floor_line(floor, medians['MinMax'], _cores())}")
    if timing_only:
        return Result(case.name, float("nan"), float("nan"), "", "", float("nan"), float("nan"), medians.get("max", float("nan")),
                      medians["MinMax"], prep_time, medians.get("default", float("nan")), {}, medians, peak, floor=floor,
                      stages=stages, rounds=rounds, round_walls=wall)
    ours_t, ort_t = wall["max"], wall["MinMax"]

    # 2. quality on held-out pages.
    art = timed_makertbin(yaml_default)[0]
    default_time = statistics.median(wall["default"])
    ours = held_out_cosines(case, ours_runner(case, art.quantized))
    method = _selected_method(art)
    log(f"  {case.name} makertbin default ({method}, {default_time:.1f} s): held-out cosine "
        f"mean {np.mean(ours):.6f} min {np.min(ours):.6f}")
    ort_all: Dict[str, Tuple[float, float]] = {}
    for m in ORT_METHODS:
        for pc in (True, False):
            label = f"{m} per_channel={pc}"
            timed = {("MinMax", True): minmax_pc, ("Entropy", True): entropy_pc}
            path = timed.get((m, pc)) or os.path.join(work, f"{case.name}_ort_{m}_{int(pc)}.onnx")
            if (m, pc) not in timed:
                ort_quantize(prepared, path, feeds, m, pc)
            c = held_out_cosines(case, ort_runner(case, path))
            ort_all[label] = (float(np.mean(c)), float(np.min(c)))
            log(f"  {case.name} onnxruntime {label}: held-out cosine mean {ort_all[label][0]:.6f} min {ort_all[label][1]:.6f}")
    best = max(ort_all, key=lambda k: ort_all[k][0])
    note = ""
    if float(np.mean(ours)) < ort_all[best][0]:
        # Show what the default search's own step-3 candidate would have given, set in the yaml.
        art3 = timed_makertbin(write_yaml(case, work, "max", cal_dir, "_step3", STEP3))[0]
        c3 = held_out_cosines(case, ours_runner(case, art3.quantized))
        note = (f"the default search stopped at {method} (ptq_faq 6.6.1.4: its best cosine on the calibration data "
                f"reached 0.995); its step-3 candidate (max-percentile 0.99995 + perchannel + asymmetric, set in the "
                f"yaml) scores held-out mean {np.mean(c3):.5f} min {np.min(c3):.5f}")
        log(f"  {case.name}: {note}")
    return Result(case.name, float(np.mean(ours)), float(np.min(ours)), method, best, ort_all[best][0], ort_all[best][1],
                  statistics.median(ours_t), statistics.median(ort_t), prep_time, default_time, ort_all,
                  medians, peak, note, floor, stages, rounds, wall)


def _cores() -> int:
    """The sample workers makertbin runs its calibration on (one per core, at most 2)."""
    from bpuemu.host.onnxgraph import sample_workers

    return sample_workers()


def _selected_method(art) -> str:
    """The method the default search chose, from the calibrated model's HzCalibration nodes."""
    from bpuemu.host.quant import calibration_nodes

    methods = set()
    per_channel = asym = False
    for n in calibration_nodes(onnx.load(art.calibrated)):
        a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        if a.get("kind") == b"activation" and a.get("method") not in (b"fixed", b"load"):
            methods.add(a["method"].decode())
            per_channel |= "axis" in a
            asym |= any(a.get("zero_points", []))
    parts = [", ".join(sorted(methods)) or "?"] + (["perchannel"] if per_channel else []) + (["asymmetric"] if asym else [])
    return " + ".join(parts)


def round_spread(r: Result, ours: str, theirs: str) -> str:
    """`` [lowest-highest]`` of the rounds' own ratios (each round's two sides ran next to each other),
    empty with one round: how far the medians' ratio can be trusted on this machine."""
    per_round = [a / b for a, b in zip(r.round_walls.get(ours, []), r.round_walls.get(theirs, []))]
    return f" [{min(per_round):.2f}-{max(per_round):.2f}]" if len(per_round) > 1 else ""


def table(results: List[Result]) -> str:
    head = ["model", "ours default cos mean/min", "best onnxruntime setting", "its cos mean/min",
            "default / MinMax", "default-rerun / MinMax", "default / Entropy", "max / MinMax",
            "peak MB default / default-rerun / max / MinMax / Entropy", "goals"]
    def ratio(r: Result, ours: str, theirs: str) -> str:
        if ours not in r.wall or theirs not in r.wall:
            return "--"
        return f"{r.wall[ours]:.1f} s / {r.wall[theirs]:.1f} s = {r.wall[ours] / r.wall[theirs]:.2f}" + round_spread(r, ours, theirs)

    rows = [[r.name, f"{r.ours_mean:.5f} / {r.ours_min:.5f}", r.ort_best or "--", f"{r.ort_mean:.5f} / {r.ort_min:.5f}",
             ratio(r, "default", "MinMax"), ratio(r, "default-rerun", "MinMax"), ratio(r, "default", "Entropy"), ratio(r, "max", "MinMax"),
             " / ".join(f"{r.peak_mb[k]:.0f}" if k in r.peak_mb else "--" for k in SIDES), r.goals]
            for r in results]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt(head), sep] + [fmt(r) for r in rows])


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=100, help="calibration samples (same for both sides)")
    ap.add_argument("--held-out", type=int, default=16, help="held-out pages for the cosine")
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds (alternating sides; medians)")
    ap.add_argument("--det-size", type=int, default=160, help="H = W of the text detector's input")
    ap.add_argument("--models", default="sample,cls,det")
    ap.add_argument("--sides", default=",".join(SIDES),
                    help="what the timing rounds run (MinMax is always run): " + ", ".join(SIDES))
    ap.add_argument("--timing-only", action="store_true",
                    help="skip the held-out quality comparison (onnxruntime's Entropy and Percentile keep every "
                         "intermediate tensor of every sample: at --det-size 640 that is more memory than 24 GB)")
    args = ap.parse_args(argv)

    logging.basicConfig(level=logging.ERROR)  # makertbin's INFO lines would drown the report
    import onnxruntime

    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"bpuemu makertbin vs onnxruntime {onnxruntime.__version__} quantize_static; {args.samples} calibration samples, "
        f"{args.held_out} held-out pages, {args.rounds} timing rounds, {os.cpu_count()} CPU(s)")
    t0 = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="bpuemu-bench-convert-") as work:
        cases = make_cases([m.strip() for m in args.models.split(",") if m.strip()], work, args.samples, args.held_out,
                           args.det_size)
        for case in cases:
            log(f"{case.name}: {os.path.basename(case.float_path)} at 1x3x{case.height}x{case.width}")
            wanted = {x.strip() for x in args.sides.split(",") if x.strip()} | {"MinMax"}
            r = bench_case(case, work, args.rounds, log, wanted, args.timing_only)
            log(f"  {case.name}: onnxruntime model preparation (not timed) {r.ort_prep:.2f} s")
            results.append(r)
    log("")
    log(table(results))
    log(f"goal 1: makertbin (whole run; calibration_type default, and max) / quantize_static (MinMax, QDQ, per-channel, "
        f"QInt8) wall time <= 1.0, medians of {args.rounds} alternating rounds, each run in a forked child; "
        f"and makertbin default's peak RSS <= quantize_static MinMax's (children forked from this process: "
        f"{_rss_mb():.0f} MB at fork, in every figure); default-rerun: makertbin default converting again with "
        f"the calibration statistics cached (BPUEMU_CALIBRATION_CACHE), every other makertbin side computes them")
    for r in results:
        if r.floor:
            log(f"  {r.name}: {floor_line(r.floor, r.wall['MinMax'], _cores())}")
        for side, st in r.stages.items():
            log(f"  {r.name} {stages_line(side, st, r.rounds)}")
            log(f"  {r.name} {runs_line(side, st, r.wall['MinMax'], _cores())}")
    log("goal 2: makertbin calibration_type default held-out mean cosine >= the best onnxruntime setting's "
        "(MinMax/Entropy/Percentile x per_channel), all run with session_options() (QDQ fusion off)")
    for r in results:
        if args.timing_only:
            continue
        log(f"  {r.name}: default search chose {r.ours_method} ({r.default_time:.1f} s)")
        if r.note:
            log(f"    {r.note}")
    log(f"total {time.perf_counter() - t0:.0f} s")
    return 0 if all(r.goals == "met" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
