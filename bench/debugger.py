#!/usr/bin/env python3
"""Does the accuracy debugger's advice pay? PP-OCRv4 det: before / after / random, in one run.

    python bench/debugger.py [--data pages|mixed] [--det-size 160] [--samples 20] [--held-out 30]
                             [--top 5] [--random-draws 3] [--data-num N] [--perf-frames 100]

1. Convert PP-OCRv4 det (rapidocr-onnxruntime 1.4.4, as bench/convert.py) with
   ``calibration_type: default`` and ``debug_mode: dump_calibration_data`` on
   --samples synthetic text pages (bench/convert.py's data, seed 7). With
   ``--data mixed``, half of the calibration and held-out images are instead
   random crops of a real photograph without text (matplotlib's sample
   ``grace_hopper.jpg``): what a detector meets in real use, and where a
   per-pixel probability map is nearly empty.
2. ``runall`` on the calibrated model and calibration_data, timed (its node
   sensitivity: output cosine with only that node quantized).
3. The nodes runall advises, at most --top: sensitive nodes whose remedy,
   simulated on the calibrated model with everything else quantized, raises
   its output cosine (``advised_nodes``), each with the better of its two
   remedies (``best_remedies``): int16 (``node_info`` InputType/OutputType:
   its input and output activations) or the CPU (``'ON': 'CPU'``: float
   weights too; X5 int16 keeps weights int8). Convert again; also the top
   --top of the sensitivity ranking, unchecked, all int16 (the seed's recipe).
4. For comparison, --random-draws random choices of as many nodes (tail nodes
   to the CPU, the others int16).
5. Each model's output cosine against the float model on --held-out pages NOT
   in the calibration set (seed 1007), per page (mean and min), and FPS from
   ``hrt_model_exec perf`` (one thread, the runs alternate, median of 3).
6. Whether int16 is int16 end to end: the dtypes of each configured node's
   activation inputs and outputs in the quantized model (weights stay int8 on X5).

The machine is shared and noisy: FPS ratios are measured side by side in one run.

Figures measured with it (det 160x160, ``--data pages`` and ``--data mixed``) are in
bench/RESULTS.md.
"""
import argparse
import logging
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import numpy as np
import onnx
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert as C  # noqa: E402  (bench/convert.py: models, pages, yaml)


def write_yaml(case, work: str, tag: str, cal_dir: str, node_info: Optional[dict] = None, debug: bool = False) -> str:
    path = C.write_yaml(case, work, "default", cal_dir, run=f"_{tag}")
    doc = yaml.safe_load(open(path))
    if debug:
        doc["model_parameters"]["debug_mode"] = "dump_calibration_data"
    if node_info:
        doc["model_parameters"]["node_info"] = node_info
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


class LogCapture(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: List[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def convert_case(yaml_path: str):
    cap = LogCapture()
    lg = logging.getLogger("bpuemu.host.makertbin")
    lg.addHandler(cap)
    old, prop = lg.level, lg.propagate
    lg.setLevel(logging.INFO)
    lg.propagate = False
    try:
        art, seconds, _ = C.timed_makertbin(yaml_path)
    finally:
        lg.removeHandler(cap)
        lg.setLevel(old)
        lg.propagate = prop
    return art, seconds, cap.lines


def node_info_for(choice: Dict[str, str]) -> Dict[str, dict]:
    return {n: ({"ON": "CPU"} if how == "cpu" else {"InputType": "int16", "OutputType": "int16"})
            for n, how in choice.items()}


def photo_crops(count: int, hw: int, seed: int) -> List[np.ndarray]:
    """Random square crops of a real photograph (matplotlib's sample data), resized to hw x hw RGB."""
    import matplotlib.cbook as cbook
    from PIL import Image

    with Image.open(cbook.get_sample_data("grace_hopper.jpg")) as img:
        photo = img.convert("RGB")
    rng = np.random.default_rng(seed)
    w, h = photo.size
    out = []
    for _ in range(count):
        s = int(rng.integers(hw, min(w, h) + 1))
        x, y = int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1))
        out.append(np.asarray(photo.crop((x, y, x + s, y + s)).resize((hw, hw), Image.BILINEAR)))
    return out


def blank_mask(case, limit: float) -> List[bool]:
    """Per held-out page: its float output never reaches ``limit`` (half an int8 step of a 0-1 map)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(case.float_path, providers=["CPUExecutionProvider"])
    return [float(np.max(sess.run(None, {case.input_name: case.normalised(p)})[0])) < limit for p in case.held_pages]


def estimated_fps(lines: List[str]) -> float:
    """The static X5 estimate makertbin logs after compiling (hb_perf's model): ``FPS=...``."""
    for line in lines:
        m = re.search(r"FPS=([\d.]+)", line)
        if m:
            return float(m.group(1))
    return float("nan")


def int16_check(quantized: str, node_info: Dict[str, dict]) -> List[str]:
    """Per configured node: the dtypes of its activation inputs and its output in the quantized model."""
    from bpuemu.host.onnxgraph import DQ, Q, GraphIndex

    idx = GraphIndex(onnx.load(quantized))

    def zp_dtype(node):
        if len(node.input) > 2 and node.input[2] in idx.inits:
            return np.dtype(idx.const(node.input[2]).dtype).name
        return "uint8"

    lines = []
    for name, cfg in node_info.items():
        n = idx.by_name.get(name)
        if n is None:
            lines.append(f"{name}: not in the quantized model")
            continue
        ins = []
        for i in n.input:
            p = idx.producer.get(i)
            if p is not None and p.op_type == DQ and p.input[0] not in idx.inits:
                ins.append(zp_dtype(p))
            elif p is not None and p.op_type == DQ:
                ins.append(f"{zp_dtype(p)} const")
            elif i in idx.inits:
                ins.append("float const")
            elif i:
                ins.append("float")
        outs = [zp_dtype(c) for o in n.output for c, _ in idx.consumers.get(o, []) if c.op_type == Q] or ["float"]
        want = "CPU" if cfg.get("ON") == "CPU" else "int16"
        lines.append(f"{name} ({n.op_type}, asked {want}): inputs {', '.join(ins)}; output {', '.join(outs)}")
    return lines


def fps(bin_path: str, frames: int) -> float:
    exe = os.path.join(os.path.dirname(sys.executable), "hrt_model_exec")
    proc = subprocess.run([exe, "perf", "--model_file", bin_path, "--thread_num", "1", "--frame_count", str(frames)],
                          capture_output=True, text=True, timeout=900)
    m = re.search(r"Frame\s+rate\s+is:\s*([\d.]+)\s*FPS", proc.stdout + proc.stderr)
    if not m:
        raise SystemExit(f"hrt_model_exec perf printed no FPS:\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    return float(m.group(1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", choices=("pages", "mixed"), default="pages",
                    help="pages: bench/convert.py's text pages; mixed: half of them real photo crops")
    ap.add_argument("--det-size", type=int, default=160)
    ap.add_argument("--samples", type=int, default=20, help="calibration pages")
    ap.add_argument("--held-out", type=int, default=30)
    ap.add_argument("--top", type=int, default=5, help="N sensitive nodes to change (<= 5)")
    ap.add_argument("--random-draws", type=int, default=3)
    ap.add_argument("--data-num", type=int, default=None, help="runall data_num (default: all calibration samples)")
    ap.add_argument("--perf-frames", type=int, default=100)
    ap.add_argument("--keep", default="", help="keep the work directory here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    from bpuemu.host.debugger import load_model, runall
    from bpuemu.host.debugger.runall import advised_nodes, ranked_nodes, remedies, tail_nodes

    log = lambda s: print(s, flush=True)  # noqa: E731
    t_all = time.time()
    work = args.keep or tempfile.mkdtemp(prefix="bpuemu-bench-debugger-")
    os.makedirs(work, exist_ok=True)
    case = C.make_cases(["det"], work, args.samples, args.held_out, args.det_size)[0]
    if args.data == "mixed":
        k, j = args.samples // 2, args.held_out // 2
        crops = photo_crops(k, args.det_size, 7)
        # Interleaved, so that runall's first data_num samples hold both kinds.
        case.cal_pages = [x for pair in zip(case.cal_pages, crops) for x in pair] + case.cal_pages[k: args.samples - k]
        case.held_pages = case.held_pages[: args.held_out - j] + photo_crops(j, args.det_size, 1007)
    cal_dir = C.write_cal_dir(case, work)
    log(f"PP-OCRv4 det at 1x3x{case.height}x{case.width}; data {args.data}: {args.samples} calibration images, "
        f"{args.held_out} held-out images; {os.cpu_count()} CPU(s)")

    variants = []   # (label, nodes, art)
    base, t_base, base_lines = convert_case(write_yaml(case, work, "base", cal_dir, debug=True))
    log(f"base conversion (calibration_type default): {t_base:.1f} s; method {C._selected_method(base)}")
    variants.append(("default calibration", [], base, {}))
    estimates = {"default calibration": estimated_fps(base_lines)}

    t0 = time.time()
    res = runall(base.calibrated, os.path.join(os.path.dirname(base.calibrated), "calibration_data"),
                 os.path.join(work, "debug_result"), data_num=args.data_num)
    t_runall = time.time() - t0
    cm = load_model(base.calibrated)
    ranking = ranked_nodes(cm, res.sensitivity)
    log(f"runall: {t_runall:.1f} s ({len(cm.ordinary)} ordinary nodes, {len(cm.calibrations)} calibration nodes, "
        f"data_num {args.data_num or len(os.listdir(cal_dir))}); report {os.path.join(work, 'debug_result', 'index.html')}")
    for a in res.advice:
        log(f"  advice: {a}")
    tails = tail_nodes(cm)
    top = advised_nodes(res, args.top)
    log(f"calibrated model output cosine {res.quantized_cosine:.5f}; one node's remedy simulated at a time: " +
        ", ".join(f"{n} ({res.remedy[n]}) {c:.5f}" for n, c in list(res.float_one.items())[:8]))
    choice = {n: res.remedy[n] for n in top}
    log("top sensitive nodes: " + ", ".join(f"{n} ({ranking[n]:.5f}, {choice[n]}"
                                            f"{', tail' if n in tails else ''})" for n in top))
    info = node_info_for(choice)
    art, t, lines = convert_case(write_yaml(case, work, "top", cal_dir, info))
    variants.append((f"debugger advice top-{len(top)}", top, art, info))
    estimates[variants[-1][0]] = estimated_fps(lines)
    fallbacks = [line for line in lines if "falls back" in line or "int16 quantization on" in line]
    # Without runall's check: the top of the sensitivity ranking, all int16 (the seed's recipe as written).
    ranked_top = list(ranking)[: args.top]
    all16 = {n: "int16" for n in ranked_top}
    info16 = node_info_for(all16)
    if ranked_top and all16 != choice:
        art16, _, lines16 = convert_case(write_yaml(case, work, "top_int16", cal_dir, info16))
        variants.append((f"ranking top-{len(ranked_top)} int16", ranked_top, art16, info16))
        estimates[variants[-1][0]] = estimated_fps(lines16)
        fallbacks += [line for line in lines16 if "falls back" in line or "int16 quantization on" in line]

    rng = random.Random(0)
    pool = [n for n in cm.of_kind("node") if cm.by_name[n].op_type != "HzPreprocess"]
    for d in range(args.random_draws):
        pick = rng.sample(pool, len(top) or args.top)
        rinfo = node_info_for({n: "cpu" if n in tails else "int16" for n in pick})
        art_r, _, lines_r = convert_case(write_yaml(case, work, f"random{d}", cal_dir, rinfo))
        variants.append((f"random {len(pick)} #{d + 1}", pick, art_r, rinfo))
        estimates[variants[-1][0]] = estimated_fps(lines_r)

    # Held-out cosines.
    rows = []
    for label, nodes, art, _ in variants:
        c = C.held_out_cosines(case, C.ours_runner(case, art.quantized))
        rows.append([label, c])
    # FPS, alternating over 3 rounds.
    rates: Dict[str, List[float]] = {label: [] for label, *_ in variants}
    for _ in range(3):
        for label, _, art, _ in variants:
            rates[label].append(fps(art.bin, args.perf_frames))
    base_fps = statistics.median(rates[variants[0][0]])

    log("")
    blank = blank_mask(case, 0.5 / 127)
    head = ["variant", "nodes changed", "held-out cosine mean / min", f"non-blank ({len(blank) - sum(blank)}) mean / min",
            "FPS hrt_model_exec perf (vs default)", "FPS X5 estimate (vs default)"]
    table = []
    base_est = estimates["default calibration"]
    for (label, nodes, art, _), (_, c) in zip(variants, rows):
        f = statistics.median(rates[label])
        nb = [x for x, b in zip(c, blank) if not b] or [float("nan")]
        table.append([label, ", ".join(nodes) or "-", f"{np.mean(c):.5f} / {np.min(c):.5f}",
                      f"{np.mean(nb):.5f} / {np.min(nb):.5f}", f"{f:.1f} ({f / base_fps:.2f})",
                      f"{estimates[label]:.1f} ({estimates[label] / base_est:.2f})"])
    widths = [max(len(x) for x in col) for col in zip(head, *table)]
    fmt = lambda cells: "| " + " | ".join(x.ljust(w) for x, w in zip(cells, widths)) + " |"  # noqa: E731
    log(fmt(head))
    log("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in table:
        log(fmt(r))
    rand = [float(np.mean(c)) for (label, *_), (_, c) in zip(variants, rows) if label.startswith("random")]
    top_mean = float(np.mean(rows[1][1]))
    nonblank = lambda c: [x for x, b in zip(c, blank) if not b]  # noqa: E731
    zeros = sum(1 for c in rows[0][1] if c == 0.0)
    log(f"{sum(blank)} of {len(case.held_pages)} held-out images have a nearly blank float output (max < half an int8 step "
        f"of a 0-1 map); {zeros} score cosine 0.0 with default calibration (an all-zero quantized output has no "
        f"direction: cosine 0 by definition)")
    log(f"mean held-out cosine: default {np.mean(rows[0][1]):.5f}, debugger top-{len(top)} {top_mean:.5f}, "
        f"random (mean of {len(rand)} draws) {np.mean(rand):.5f}; goal >= 0.95: "
        f"{'met' if top_mean >= 0.95 else 'NOT met'}; beats chance: {'yes' if top_mean > np.mean(rand) else 'no'}")
    rand_nb = [float(np.mean(nonblank(c))) for (label, *_), (_, c) in zip(variants, rows) if label.startswith("random")]
    if any(blank):
        log(f"non-blank images only: default {np.mean(nonblank(rows[0][1])):.5f}, debugger top-{len(top)} "
            f"{np.mean(nonblank(rows[1][1])):.5f}, random {np.mean(rand_nb):.5f}")
    log("int16 end to end? (dtypes in the quantized model; weights stay int8 on X5)")
    for label, _, art, info in variants[1:]:
        if not label.startswith("random"):
            for line in int16_check(art.quantized, info):
                log(f"  {label}: {line}")
    for line in fallbacks:
        log(f"  makertbin: {line}")
    log(f"runall on PP-OCRv4 det {case.height}x{case.width}: {t_runall:.1f} s; total {time.time() - t_all:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
