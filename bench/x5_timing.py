#!/usr/bin/env python3
"""X5 timing benchmark: bpuemu's modeled X5 figures against what RDK X5 boards measure.

    python bench/x5_timing.py [--set fit|check|all] [--cache DIR] [--torch-python PY]
                              [--models NAME,...] [--no-build] [--csv OUT.csv]

The published figures are bench/x5_fit.csv (what the timing model may be fitted to) and
bench/x5_check.csv (other published X5 figures, never fitted to): RDK X5 boards running
``hrt_model_exec perf``, as D-Robotics publishes them in the rdk_model_zoo repository
(each row names its file and commit). For every row this script

1. rebuilds the architecture with random weights and exports ONNX (bench/x5_export.py:
   timm / torchvision / ultralytics, no pretrained weights, heads cut as the model zoo
   deploys them, batch 1, opset 11), in a subprocess of --torch-python (default: this
   Python; torch & co. are the ``x5bench`` extra, never a dependency of the tools);
2. converts it with ``hb_mapper makertbin --fast-perf --model M.onnx --model-type onnx
   --march bayes-e -i INPUT 1x3xHxW`` (fast-perf has no input-type flag: the .bin takes a
   featuremap, where the published .bins take nv12);
3. asks the X5 timing model for the figures ``hrt_model_exec perf`` would show: the
   1-thread latency and the FPS at the published thread count (``modeled``: the one
   function this script gets its figures from).

Both steps are cached: ``DIR/onnx/<model>.onnx`` and ``DIR/bin/<model>/<model>.bin``
(with makertbin's output beside it, ``makertbin.log``); a step is redone only when its output is missing
or older than its input. ``DIR/STATUS.md`` lists what is exported and converted, and why
something failed.

It prints one line per model (published FPS and 1-thread latency, modeled FPS and latency,
modeled/published), then per set: median |FPS error|, the share of models within 15 %,
20 % and 25 %, the Spearman rank correlation of the FPS, and the same for the 1-thread
latency; then issue 16's goals on the check set (median |FPS error| <= 10 %, >= 80 % of
models within 20 %, Spearman >= 0.95, median |latency error| <= 15 %), each met or not.

It also prints, per set and per architecture family (``FAMILIES``, read off each converted model's
operators: YOLO, attention, GELU/LayerNorm, squeeze-excitation, other CNNs), the median |FPS
error|, the models within 20 %, the Spearman rank correlation and the median |1-thread latency
error|; and, where the real compiler's estimate line is published (``compiler_est_*``),
makertbin's BPU-only line against it. ``--input-type nv12`` gives the figures on the .bins the
boards run; bench/x5_fit.py fits and cross-validates on either.

An error is modeled / published - 1. The published FPS of a row is measured with
``threads`` threads (2 for the YOLO tables; 4 inferred for the classification tables,
which do not say; rows without it are taken at 4).

Latest figures (bench/RESULTS.md has every run, with its date and commit): the fitted model on
featuremap .bins, fit set FPS median error 8 %, 32/39 within 20 %, Spearman 0.975; check set FPS
median error 12 %, 17/25 within 20 %, Spearman 0.960, latency median error 17 %.
"""
import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
SETS = {"fit": os.path.join(HERE, "x5_fit.csv"), "check": os.path.join(HERE, "x5_check.csv")}
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "bpuemu", "x5_timing")
DEFAULT_THREADS = 4

#: issue 16's goals on the models not used for fitting (the check set).
GOALS = (("median |FPS error|", "fps_median", "<=", 0.10),
         ("models within 20% (FPS)", "fps_within20", ">=", 0.80),
         ("Spearman rank correlation (FPS)", "fps_spearman", ">=", 0.95),
         ("median |1-thread latency error|", "lat_median", "<=", 0.15))


# --------------------------------------------------------------------------------------------
# The modeled figures: the ONE place they come from.
# --------------------------------------------------------------------------------------------

def modeled(bin_path: str, threads: int, estimator: str = "timing") -> Tuple[float, float]:
    """(FPS at ``threads`` threads, 1-thread latency in ms) the X5 would show for ``bin_path``.

    ``timing``: the X5 timing model as ``hrt_model_exec perf``'s X5 block shows it
    (``bpuemu.host.tools.static_perf.modeled_perf``: BPU and CPU steps, several threads sharing
    the one BPU). ``line``: makertbin's estimate line from the same model (BPU subgraphs only,
    one frame in flight: FPS = 1 / latency at any thread count), as the real compiler's line; with
    a bpuemu from before the timing model (no ``modeled_perf``), hb_perf's estimate of that time,
    the "before" figures of issue 16.
    """
    from bpuemu.host.tools import static_perf

    if not hasattr(static_perf, "modeled_perf"):
        if estimator != "line":
            raise RuntimeError("this bpuemu has no X5 timing model (static_perf.modeled_perf): use --estimator line")
        from bpuemu.common.container import read_bin

        binfile = read_bin(bin_path)
        est = static_perf.estimate_model(binfile.model(), binfile.blobs)
        return est.fps or math.inf, est.latency_ms
    d = static_perf.modeled_perf(bin_path, threads)
    if estimator == "line":
        return d["estimate_fps"] or math.inf, d["estimate_latency_us"] / 1e3
    return d["fps"], d["latency_1thread_ms"]


ESTIMATORS = {"timing": "the X5 timing model as hrt_model_exec perf shows it (static_perf.modeled_perf)",
              "line": "makertbin's estimate line (BPU only, FPS = 1 / latency)"}


#: The architecture families the figures are given for, in the order a model is sorted into them
#: (``arch_family``): what costs differ between them on the X5.
FAMILIES = (
    ("yolo", "ultralytics YOLO detect / seg / pose / cls"),
    ("attention", "nets with attention (Softmax over activations x activations)"),
    ("gelu", "nets with GELU (Erf) and LayerNorm, no attention"),
    ("se", "squeeze-excitation nets (a gate from a globally pooled map scales it: 2+ pooled maps feed convs)"),
    ("cnn", "other CNNs"),
)


def arch_family(bin_path: str, source: str) -> str:
    """The family of a converted model (``FAMILIES``), from the operators of its plan."""
    from collections import Counter

    from bpuemu.common.container import read_bin

    if source.startswith("ultralytics:"):
        return "yolo"
    ops = Counter(t for step in read_bin(bin_path).model().plan for t in step.op_types)
    if ops["Softmax"]:
        return "attention"
    if ops["Erf"] or ops["Gelu"]:
        return "gelu"
    if ops["GlobalAveragePool"] + ops["ReduceMean"] >= 2:
        return "se"
    return "cnn"


# --------------------------------------------------------------------------------------------
# Published rows
# --------------------------------------------------------------------------------------------

@dataclass
class Row:
    set: str
    model: str
    family: str
    input_hw: Tuple[int, int]
    latency_ms: Optional[float]      # published 1-thread latency
    fps: Optional[float]             # published FPS at `threads`
    threads: int
    threads_note: str                # "", "inferred" or "assumed"
    source: str                      # architecture_source
    source_path: str
    modeled_fps: Optional[float] = None
    modeled_latency_ms: Optional[float] = None
    status: str = ""
    compiler_est_latency_us: Optional[float] = None   # the real compiler's estimate line, where published
    modeled_line_latency_us: Optional[float] = None   # makertbin's line (BPU only) for the same model
    arch_family: str = ""                             # FAMILIES, read off the converted model

    @property
    def fps_ratio(self) -> Optional[float]:
        return self.modeled_fps / self.fps if self.modeled_fps and self.fps else None

    @property
    def lat_ratio(self) -> Optional[float]:
        return self.modeled_latency_ms / self.latency_ms if self.modeled_latency_ms and self.latency_ms else None


def _num(text: str) -> Optional[float]:
    text = (text or "").strip().rstrip("+")
    return float(text) if text else None


def read_rows(set_name: str, path: str) -> List[Row]:
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            h, w = (int(v) for v in r["input_hw"].lower().split("x"))
            threads_text = r["threads"].strip()
            if not threads_text:
                threads, note = DEFAULT_THREADS, "assumed"
            else:
                threads = int(threads_text.split("(")[0])
                note = "inferred" if "inferred" in threads_text else ""
            rows.append(Row(set_name, r["model"], r["family"], (h, w), _num(r["x5_latency_1thread_ms"]),
                            _num(r["x5_fps"]), threads, note, r["architecture_source"], r["source_path"],
                            compiler_est_latency_us=_num(r.get("compiler_est_latency_us", ""))))
    return rows


# --------------------------------------------------------------------------------------------
# The cache: export, convert
# --------------------------------------------------------------------------------------------

#: Where each input type's .bins are cached.
BIN_DIRS = {"featuremap": "bin", "nv12": "bin_nv12"}


class Cache:
    def onnx(self, model: str) -> str:
        return os.path.join(self.root, "onnx", f"{model}.onnx")

    def __init__(self, root: str, input_type: str = "featuremap"):
        self.root = os.path.abspath(root)
        self.input_type = input_type

    def bin_dir(self, model: str) -> str:
        return os.path.join(self.root, BIN_DIRS[self.input_type], model)

    def bin(self, model: str) -> str:
        return os.path.join(self.bin_dir(model), f"{model}.bin")

    def export_log(self) -> str:
        return os.path.join(self.root, "logs", "export.log")


def _fresh(output: str, source: str) -> bool:
    return os.path.exists(output) and (not os.path.exists(source) or os.path.getmtime(output) >= os.path.getmtime(source))


def export_missing(rows: Sequence[Row], cache: Cache, torch_python: str) -> Dict[str, str]:
    """Export the rows whose ONNX is not cached, in one subprocess; model -> error line."""
    todo = [r for r in rows if not os.path.exists(cache.onnx(r.model))]
    if not todo:
        return {}
    cmd = [torch_python, os.path.join(HERE, "x5_export.py")]
    for r in todo:
        cmd += ["--model", r.source, f"{r.input_hw[0]}x{r.input_hw[1]}", cache.onnx(r.model)]
    os.makedirs(os.path.dirname(cache.export_log()), exist_ok=True)
    print(f"exporting {len(todo)} model(s) with {torch_python} ...", flush=True)
    with open(cache.export_log(), "a") as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log.write(proc.stdout)
    errors = {}
    for r in todo:
        if not os.path.exists(cache.onnx(r.model)):
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"ERROR export {r.source} ")]
            errors[r.model] = lines[-1] if lines else (proc.stdout.strip().splitlines() or ["export failed"])[-1]
    return errors


def onnx_input(path: str) -> Tuple[str, List[int]]:
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    inp = next(i for i in graph.input if i.name not in inits)
    return inp.name, [d.dim_value for d in inp.type.tensor_type.shape.dim]


def hb_mapper() -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "hb_mapper")
    return exe if os.path.exists(exe) else "hb_mapper"


def nv12_config(onnx_path: str, model: str, input_name: str, hw: Tuple[int, int]) -> str:
    """The yaml of --fast-perf's built-in settings with an nv12 runtime input (rgb NCHW in training,
    no normalisation), as the published .bins take: fast-perf itself has no input-type flag."""
    from bpuemu.host.mapper.makertbin import FAST_PERF_REMOVED_TYPES

    return "\n".join([
        "model_parameters:",
        f"  onnx_model: '{onnx_path}'",
        "  march: bayes-e",
        f"  output_model_file_prefix: '{model}'",
        "  working_dir: model_output",
        f"  remove_node_type: '{';'.join(FAST_PERF_REMOVED_TYPES)}'",
        "input_parameters:",
        f"  input_name: '{input_name}'",
        f"  input_shape: 1x3x{hw[0]}x{hw[1]}",
        "  input_type_train: rgb",
        "  input_layout_train: NCHW",
        "  input_type_rt: nv12",
        "  norm_type: no_preprocess",
        "calibration_parameters:",
        "  calibration_type: skip",
        "  optimization: set_Softmax_input_int8",
        "compiler_parameters:",
        "  compile_mode: latency",
        "  optimize_level: O3",
        ""])


def convert(row: Row, cache: Cache, timeout_s: float = 1800) -> Optional[str]:
    """makertbin into DIR/bin*/<model>/ unless cached (--fast-perf; nv12: its settings in a yaml);
    the error line or None."""
    onnx_path, bin_path = cache.onnx(row.model), cache.bin(row.model)
    if _fresh(bin_path, onnx_path):
        return None
    name, _ = onnx_input(onnx_path)
    h, w = row.input_hw
    if cache.input_type == "featuremap":
        cmd = [hb_mapper(), "makertbin", "--fast-perf", "--model", onnx_path, "--model-type", "onnx",
               "--march", "bayes-e", "-i", name, f"1x3x{h}x{w}"]
    else:
        cmd = [hb_mapper(), "makertbin", "--config", "config.yaml", "--model-type", "onnx"]
    os.makedirs(cache.bin_dir(row.model), exist_ok=True)
    print(f"converting {row.model} ...", flush=True)
    t0 = time.time()
    # makertbin writes model_output/ (the .bin and four large ONNX stages) where it runs: run it
    # aside and keep only the .bin and its output.
    os.makedirs(os.path.join(cache.root, "tmp"), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{row.model}.", dir=os.path.join(cache.root, "tmp")) as work:
        if cache.input_type == "nv12":
            with open(os.path.join(work, "config.yaml"), "w") as f:
                f.write(nv12_config(onnx_path, row.model, name, row.input_hw))
        try:
            proc = subprocess.run(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"makertbin did not finish within {timeout_s:.0f} s"
        with open(os.path.join(cache.bin_dir(row.model), "makertbin.log"), "w") as f:
            f.write(" ".join(cmd) + "\n")
            if cache.input_type == "nv12":
                f.write(nv12_config(onnx_path, row.model, name, row.input_hw))
            f.write(proc.stdout)
        made = os.path.join(work, "model_output", f"{row.model}.bin")
        if proc.returncode != 0 or not os.path.exists(made):
            errs = [ln for ln in proc.stdout.splitlines() if "ERROR" in ln]
            return (errs or proc.stdout.strip().splitlines() or [f"exit {proc.returncode}"])[-1].strip()
        os.replace(made, bin_path)
    print(f"converted {row.model} in {time.time() - t0:.0f} s", flush=True)
    return None


def write_zeroed(onnx_path: str, out_gz: str) -> Tuple[int, int]:
    """``onnx_path`` with every float initializer of more than 16 values zeroed, gzip-compressed
    (deterministic: no timestamp) to ``out_gz``: the graph the timing model reads, in a few tens of
    KB. Small float constants (Resize scales, ...) and integer ones (shapes) are kept. Returns
    (ONNX bytes, gzip bytes)."""
    import gzip

    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(onnx_path)
    for init in model.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype.kind == "f" and a.size > 16:
            init.CopyFrom(numpy_helper.from_array(np.zeros_like(a), init.name))
    data = model.SerializeToString()
    with open(out_gz, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as f:
        f.write(data)
    return len(data), os.path.getsize(out_gz)


def _failed_file(path: str) -> str:
    return path + ".FAILED"


def record(path: str, error: Optional[str]) -> None:
    """Keep ``error`` beside the output ``path`` it prevented (``path``.FAILED), or clear it."""
    failed = _failed_file(path)
    if error:
        os.makedirs(os.path.dirname(failed), exist_ok=True)
        with open(failed, "w") as f:
            f.write(error.strip() + "\n")
    elif os.path.exists(failed):
        os.remove(failed)


def _state(path: str) -> str:
    if os.path.exists(path):
        return "yes"
    failed = _failed_file(path)
    if os.path.exists(failed):
        with open(failed) as f:
            return "FAILED: " + f.read().strip().replace("|", "/")
    return "not yet"


def write_status(cache: Cache, rows: Sequence[Row]) -> None:
    """DIR/STATUS.md: per model, whether its ONNX and each input type's .bin are cached, or why not."""
    lines = ["# X5 timing benchmark cache", "",
             f"Written by bench/x5_timing.py at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}.", "",
             "- `onnx/<model>.onnx`: bench/x5_export.py (random weights, opset 11, batch 1; ultralytics heads cut "
             "as the model zoo deploys them).",
             "- `bin/<model>/<model>.bin`: `hb_mapper makertbin --fast-perf --model onnx/<model>.onnx --model-type onnx "
             "--march bayes-e -i <input> 1x3xHxW` (featuremap input).",
             "- `bin_nv12/<model>/<model>.bin`: the same built-in fast-perf settings in a yaml, with "
             "`input_type_rt: nv12` (rgb NCHW in training, no_preprocess) as the published .bins take.",
             "- beside each .bin, `makertbin.log` (the command, the yaml for nv12, makertbin's output); a failed step "
             "leaves `<output>.FAILED` with its error line.", "",
             "| set | model | architecture_source | input | onnx | bin (featuremap) | bin_nv12 |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        bins = [_state(Cache(cache.root, t).bin(r.model)) for t in ("featuremap", "nv12")]
        lines.append(f"| {r.set} | {r.model} | `{r.source}` | {r.input_hw[0]}x{r.input_hw[1]} "
                     f"| {_state(cache.onnx(r.model))} | {bins[0]} | {bins[1]} |")
    os.makedirs(cache.root, exist_ok=True)
    tmp = os.path.join(cache.root, ".STATUS.md.tmp")
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, os.path.join(cache.root, "STATUS.md"))


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------

def _ranks(values: Sequence[float]) -> List[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation (Pearson on average ranks); None below 3 pairs."""
    if len(a) < 3:
        return None
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else None


@dataclass
class Stats:
    n: int = 0
    median: Optional[float] = None
    within: Dict[int, float] = field(default_factory=dict)
    spearman: Optional[float] = None


def error_stats(published: Sequence[float], modeled_: Sequence[float]) -> Stats:
    errs = [abs(m / p - 1) for p, m in zip(published, modeled_)]
    if not errs:
        return Stats()
    return Stats(len(errs), statistics.median(errs), {b: sum(e <= b / 100 for e in errs) / len(errs) for b in (15, 20, 25)},
                 spearman(published, modeled_))


def set_stats(rows: Sequence[Row]) -> Dict[str, Stats]:
    fps = [(r.fps, r.modeled_fps) for r in rows if r.fps and r.modeled_fps]
    lat = [(r.latency_ms, r.modeled_latency_ms) for r in rows if r.latency_ms and r.modeled_latency_ms]
    return {"fps": error_stats([p for p, _ in fps], [m for _, m in fps]),
            "lat": error_stats([p for p, _ in lat], [m for _, m in lat])}


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------

def _f(v: Optional[float], fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def print_table(rows: Sequence[Row]) -> None:
    head = (f"{'set':<5} {'model':<22} {'family':<9} {'input':>7} {'thr':>4} {'pub FPS':>8} {'mod FPS':>8} {'FPS x':>6}  "
            f"{'pub ms':>7} {'mod ms':>7} {'lat x':>6}  status")
    print(head)
    print("-" * len(head))
    for r in rows:
        thr = f"{r.threads}{'?' if r.threads_note else ''}"
        print(f"{r.set:<5} {r.model:<22} {r.arch_family:<9} {r.input_hw[0]:>3}x{r.input_hw[1]:<3} {thr:>4} {_f(r.fps):>8} "
              f"{_f(r.modeled_fps):>8} {_f(r.fps_ratio, '.2f'):>6}  {_f(r.latency_ms, '.2f'):>7} "
              f"{_f(r.modeled_latency_ms, '.2f'):>7} {_f(r.lat_ratio, '.2f'):>6}  {r.status or 'ok'}")
    print("(x: modeled / published; thr: the published FPS's thread count, ? = inferred or assumed)")


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def print_summary(name: str, rows: Sequence[Row]) -> Dict[str, Stats]:
    st = set_stats(rows)
    modeled_n = sum(1 for r in rows if r.modeled_fps)
    print(f"\n{name} set: {modeled_n} of {len(rows)} models modeled")
    for key, label in (("fps", "FPS"), ("lat", "1-thread latency")):
        s = st[key]
        if not s.n:
            print(f"  {label:<17} no figures")
            continue
        within = ", ".join(f"{_pct(s.within[b])} ({round(s.within[b] * s.n)}/{s.n}) within {b}%" for b in (15, 20, 25))
        print(f"  {label:<17} median |error| {_pct(s.median)}; {within}; Spearman {_f(s.spearman, '.3f')}")
    families = sorted({r.family for r in rows})
    by_family = []
    for fam in families:
        ratios = [r.fps_ratio for r in rows if r.family == fam and r.fps_ratio]
        if ratios:
            by_family.append(f"{fam} {statistics.median(ratios):.2f} ({len(ratios)})")
    if by_family:
        print(f"  median FPS ratio by family: {'; '.join(by_family)}")
    return st


def print_families(rows: Sequence[Row]) -> None:
    """Per set and family (``FAMILIES``): median |FPS error|, the share within 20 %, Spearman, 1-thread latency."""
    print("\nper family (FPS: median |error|, within 20 %, Spearman; 1-thread latency: median |error|):")
    for s in ("fit", "check", "all"):
        for fam, _ in FAMILIES + (("all", ""),):
            sub = [r for r in rows if (s == "all" or r.set == s) and (fam == "all" or r.arch_family == fam)]
            st = set_stats(sub)
            f, lat = st["fps"], st["lat"]
            if not f.n:
                continue
            ratios = [r.fps_ratio for r in sub if r.fps_ratio]
            print(f"  {s:<5} {fam:<10} n={f.n:<3} FPS median |err| {_pct(f.median):>4}, within 20% "
                  f"{round(f.within[20] * f.n)}/{f.n}, Spearman {_f(f.spearman, '.3f'):>6}, median ratio "
                  f"{statistics.median(ratios):.2f}; latency median |err| {_pct(lat.median):>4}")


def print_compiler_estimates(rows: Sequence[Row]) -> None:
    """makertbin's estimate line (BPU only) against the real compiler's published line, where there is one."""
    pairs = [r for r in rows if r.compiler_est_latency_us and r.modeled_line_latency_us]
    if not pairs:
        return
    print("\nmakertbin's estimate line against the real compiler's (compiler_est_latency_us):")
    for r in pairs:
        print(f"  {r.model:<22} published {r.compiler_est_latency_us:8.1f} us, modeled {r.modeled_line_latency_us:8.1f} us, "
              f"x{r.modeled_line_latency_us / r.compiler_est_latency_us:.2f}")
    errs = [abs(r.modeled_line_latency_us / r.compiler_est_latency_us - 1) for r in pairs]
    print(f"  median |error| {_pct(statistics.median(errs))}, {sum(e <= 0.2 for e in errs)}/{len(errs)} within 20%")


def print_goals(st: Dict[str, Stats]) -> None:
    values = {"fps_median": st["fps"].median, "fps_within20": st["fps"].within.get(20), "fps_spearman": st["fps"].spearman,
              "lat_median": st["lat"].median}
    print("\nissue 16 goals (check set, models not used for fitting):")
    for label, key, op, target in GOALS:
        v = values[key]
        met = v is not None and (v <= target if op == "<=" else v >= target)
        shown = _f(v, ".3f") if key == "fps_spearman" else _pct(v)
        want = f"{target:.2f}" if key == "fps_spearman" else f"{100 * target:.0f}%"
        print(f"  {label:<34} {shown:>6}  goal {op} {want:<5}  {'met' if met else 'NOT met'}")


def write_csv(path: str, rows: Sequence[Row]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["set", "model", "arch_family", "input_hw", "threads", "published_fps", "modeled_fps", "fps_ratio",
                    "published_latency_ms", "modeled_latency_ms", "latency_ratio", "status"])
        for r in rows:
            w.writerow([r.set, r.model, r.arch_family, f"{r.input_hw[0]}x{r.input_hw[1]}", r.threads, r.fps,
                        r.modeled_fps, r.fps_ratio, r.latency_ms, r.modeled_latency_ms, r.lat_ratio, r.status or "ok"])


# --------------------------------------------------------------------------------------------

def _torch_python_default() -> str:
    try:
        import torch  # noqa: F401
        return sys.executable
    except ImportError:
        return ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", choices=["fit", "check", "all"], default="all")
    p.add_argument("--cache", default=os.environ.get("BPUEMU_X5_CACHE", DEFAULT_CACHE),
                   help=f"ONNX / .bin cache (default $BPUEMU_X5_CACHE or {DEFAULT_CACHE})")
    p.add_argument("--torch-python", default="", help="a Python with torch, timm, torchvision, ultralytics for the "
                   "exports (default: this one, if it has torch)")
    p.add_argument("--models", default="", help="only these models (comma-separated names of the csv)")
    p.add_argument("--no-build", action="store_true", help="use only what is cached: export and convert nothing")
    p.add_argument("--csv", default="", help="also write the per-model table to this csv")
    p.add_argument("--input-type", choices=sorted(BIN_DIRS), default="featuremap",
                   help="the converted models' runtime input: featuremap (default: hb_mapper makertbin --fast-perf "
                        "as typed, DIR/bin/) or nv12 (as the published .bins take: --fast-perf's settings in a yaml "
                        "with input_type_rt nv12, DIR/bin_nv12/)")
    p.add_argument("--write-ci-graphs", default="", metavar="DIR",
                   help="write the --models' cached ONNX with zeroed weights as DIR/<model>.onnx.gz (the CI band "
                        "test's graphs, tests/data/x5) and stop")
    p.add_argument("--estimator", choices=sorted(ESTIMATORS), default="timing",
                   help="timing (default): the figures hrt_model_exec perf's X5 block shows; line: makertbin's "
                        "estimate line (BPU only, FPS = 1 / latency)")
    a = p.parse_args(argv)
    estimator = a.estimator

    cache = Cache(a.cache, a.input_type)
    names = {n.strip() for n in a.models.split(",") if n.strip()}
    all_rows = [r for s in ("fit", "check") for r in read_rows(s, SETS[s])]
    rows = [r for r in all_rows if (a.set == "all" or r.set == a.set) and (not names or r.model in names)]
    unknown = names - {r.model for r in all_rows}
    if unknown:
        print(f"ERROR no such model in the csv files: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if a.write_ci_graphs:
        if not names:
            print("ERROR --write-ci-graphs needs --models", file=sys.stderr)
            return 2
        os.makedirs(a.write_ci_graphs, exist_ok=True)
        for r in rows:
            if not os.path.exists(cache.onnx(r.model)):
                print(f"ERROR {r.model}: no cached ONNX ({cache.onnx(r.model)}); run without --write-ci-graphs first",
                      file=sys.stderr)
                return 2
            raw, packed = write_zeroed(cache.onnx(r.model), os.path.join(a.write_ci_graphs, f"{r.model}.onnx.gz"))
            print(f"{r.model}: {raw} bytes -> {packed} bytes gzip")
        return 0
    if not a.no_build:
        torch_python = a.torch_python or _torch_python_default()
        missing = [r for r in rows if not os.path.exists(cache.onnx(r.model))]
        if missing and not torch_python:
            print("ERROR exporting needs torch: install the x5bench extra (pip install -e .[x5bench]) or give "
                  "--torch-python PY", file=sys.stderr)
            return 2
        errors = export_missing(rows, cache, torch_python)
        for r in rows:
            record(cache.onnx(r.model), errors.get(r.model))
            if r.model in errors:
                r.status = errors[r.model]
    for r in rows:
        if r.status:
            continue
        if not os.path.exists(cache.onnx(r.model)):
            r.status = "no ONNX (--no-build)"
            continue
        if not a.no_build:
            err = convert(r, cache)
            record(cache.bin(r.model), err)
            if err:
                r.status = f"makertbin: {err}"
                write_status(cache, all_rows)
                continue
        if not os.path.exists(cache.bin(r.model)):
            r.status = "no .bin (--no-build)"
            continue
        try:
            r.modeled_fps, r.modeled_latency_ms = modeled(cache.bin(r.model), r.threads, estimator)
            r.arch_family = arch_family(cache.bin(r.model), r.source)
            if r.compiler_est_latency_us:
                r.modeled_line_latency_us = modeled(cache.bin(r.model), 1, "line")[1] * 1e3
        except Exception as e:  # one model's failure is a status line, not the end of the run
            r.status = f"model: {type(e).__name__}: {e}"
        if not a.no_build:
            write_status(cache, all_rows)

    if not a.no_build:
        write_status(cache, all_rows)
    print(f"\nmodeled by: {ESTIMATORS[estimator]}; {a.input_type} input; cache {cache.root}")
    print_table(rows)
    stats = {}
    for s in ("fit", "check"):
        sub = [r for r in rows if r.set == s]
        if sub:
            stats[s] = print_summary(s, sub)
    print_families(rows)
    print_compiler_estimates(rows)
    if "check" in stats:
        print_goals(stats["check"])
    if a.csv:
        write_csv(a.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
