#!/usr/bin/env python3
"""The OCR evaluation's board side over one board and over two, side by side in one run.

    python bench/ocr_farm.py --model-dir model_output [--lines 1000] [--goal 1.8]

``--model-dir`` is the OCR sample's makertbin working_dir (ppocr_det, ppocr_cls,
ppocr_rec: 03_build.sh writes it). The bench makes ``--lines`` evaluation line
images (dataset.make), starts two hrt_boardd on loopback, and runs the
evaluation's board side (direction classifier + recogniser per line, each
line's results appended to a fresh results file) over board A alone, then over
A and B, through the same code as ``bpuemu-ocr-eval --sides board``. Prints
each run's wall time, images/s, each board's share, and the speed-up
(1-board time / 2-board time). Exit status 1 when the speed-up is below
``--goal``.

What limits it on a 2-core machine: each daemon runs a model on one
onnxruntime thread, so two boards can use both cores, but this client's
preprocessing (resize, BGR packing), the CTC decoding of 40 x 6625 logits and
gRPC's own work run on the same two cores (about 18 ms per line here), and so
does anything else running on the machine.

Measured (2026-12-01, 2 cores shared with seven other engineers' jobs):
- 1000 lines at load average 10-16: 1 board 165.4 s, 2 boards 253.4 s: 0.65x;
- 1000 lines at load average 6-8: 1 board 85.3 s (85 ms per line), 2 boards
  120.0 s (236 ms per line on each board): 0.71x;
- 200 lines at load average 5-7: 18.1 s vs 13.1 s: 1.38x (and 1.17x with
  OMP/OPENBLAS/MKL_NUM_THREADS=1 for the daemons, so no BLAS thread pool).
The goal of 1.8x is not met here. With the cores oversubscribed, a second
local daemon adds a busy process competing for the same two cores rather than
capacity; why each board's per-line time nearly triples over the longer
2-board run (on both boards alike, the fresh one too) is not yet explained.
"""
import argparse
import os
import sys
import tempfile
import time

from bpuemu.host.samples.ocr import dataset
from bpuemu.common.errors import BpuEmuError
from bpuemu.host.samples.ocr.evaluate import OcrModels, evaluate, local_boards


def _run(models, split, boards, results, lines):
    t0 = time.perf_counter()
    rep = evaluate(models, split, results, sides=("board",), boards=boards, pages=0, lines=lines,
                   progress=False, echo=lambda s: None)
    return time.perf_counter() - t0, rep


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True, help="the OCR sample's model_output (ppocr_det/cls/rec)")
    p.add_argument("--lines", type=int, default=1000)
    p.add_argument("--goal", type=float, default=1.8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        models = OcrModels.from_paths(*(os.path.join(args.model_dir, f"ppocr_{k}") for k in ("det", "cls", "rec")))
    except BpuEmuError as exc:
        p.error(f"--model-dir {args.model_dir}: {exc}")
    with tempfile.TemporaryDirectory(prefix="bench-ocr-farm-") as tmp:
        t0 = time.perf_counter()
        split = dataset.make(tmp, seed=args.seed, n_pages=0, n_lines=args.lines, split="evaluation")
        print(f"{args.lines} line images made in {time.perf_counter() - t0:.1f} s")
        with local_boards(2, tmp, echo=lambda s: None) as (a, b):
            # one warm-up item per board (upload + load of the three .bin, first-run allocations)
            _run(models, split, [a], os.path.join(tmp, "warm_a.jsonl"), 1)
            _run(models, split, [b], os.path.join(tmp, "warm_b.jsonl"), 1)
            one_s, one = _run(models, split, [a], os.path.join(tmp, "one.jsonl"), args.lines)
            two_s, two = _run(models, split, [a, b], os.path.join(tmp, "two.jsonl"), args.lines)
    same = one.scores["board"] == two.scores["board"]
    print(f"1 board : {one_s:7.1f} s  {args.lines / one_s:6.1f} images/s")
    print(f"2 boards: {two_s:7.1f} s  {args.lines / two_s:6.1f} images/s  ("
          + ", ".join(f"{s.name}: {s.items} images, {1e3 * s.busy_s / max(1, s.items):.0f} ms each" for s in two.boards)
          + ")")
    ratio = one_s / two_s
    print(f"speed-up 2 boards / 1 board: {ratio:.2f}x (goal {args.goal}x); metrics identical: {same}")
    return 0 if ratio >= args.goal and same else 1


if __name__ == "__main__":
    sys.exit(main())
