#!/usr/bin/env python3
"""The OCR evaluation's board side over one board and over two, side by side in one run.

    python bench/ocr_farm.py --model-dir model_output [--lines 1000] [--goal 1.8]

``--model-dir`` is the OCR sample's makertbin working_dir (ppocr_det, ppocr_cls,
ppocr_rec: 03_build.sh writes it). The bench makes ``--lines`` evaluation line
images (dataset.make), starts two hrt_boardd on loopback, and runs the
evaluation's board side (direction classifier + recogniser per line, each
line's results appended to a fresh results file) over board A alone, then over
A and B, through the same code as ``bpuemu-ocr-eval --sides board``. Prints
each run's wall time, images/s, each board's share, the speed-up (1-board time
/ 2-board time), and, for each quarter of each run, the wall time per line and
the CPU time per line of this client and of each daemon (Linux /proc), with
the load average. Exit status 1 when the speed-up is below ``--goal``.

What the speed-up can be: a line costs the client ~5 ms of CPU (PNG decoding,
resizing, the CTC decoding of 40 x 6625 logits, hashing the outputs, the
sockets) and the board ~40 ms (the recogniser is ~95 % of it, in onnxruntime).
One board runs them one after the other on about one core; two boards can keep
both cores busy, so two free cores allow at most about 2 x, less the client's
share. With the kernel's autogroup scheduling on (kernel.sched_autogroup_enabled
=1, as on the shared machine here), the two cores are shared fairly between
sessions: this bench, its client threads and both daemons are one group, which
gets 2/(K+1) cores against K other busy sessions however many processes it
runs. One board keeps about one core busy; against one other busy session the
group gets one core, and two boards cannot be faster than one. The CPU time
per line tells the run's own cost apart from the machine's load (the CPU rows
stay flat when the wall rows move).

Latest figures (bench/RESULTS.md has every run): 1000 lines, 2 boards over 1: 2.10x with the two
cores free, 1.06-1.25x with other jobs busy beside it; the CPU time per line stays flat.
"""
import argparse
import os
import sys
import tempfile
import threading
import time

from bpuemu.host.samples.ocr import dataset
from bpuemu.common.errors import BpuEmuError
from bpuemu.host.samples.ocr.evaluate import OcrModels, evaluate, local_boards

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from board_perf import autogroup_on, load_average  # noqa: E402  (bench/board_perf.py: the machine's header lines)


def _cpu_s(pid=None) -> float:
    """CPU seconds (user + system) of this process, or of process ``pid`` (0 where /proc is not there)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _children() -> list:
    """This process's child processes (the two daemons), from /proc; [] elsewhere."""
    pids = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        return []
    return sorted(pids)


class _Sampler:
    """Every half second: (time, lines in the results file, this client's CPU s, each daemon's CPU s)."""

    def __init__(self, results: str, daemons: list):
        self.results, self.daemons = results, daemons
        self.samples = []
        self._stop = threading.Event()
        self._lines, self._offset = 0, 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        if os.path.exists(self.results):
            with open(self.results, "rb") as f:
                f.seek(self._offset)
                new = f.read()
            self._lines += new.count(b"\n")
            self._offset += len(new)
        done = max(0, self._lines - 1)  # the header line
        self.samples.append((time.perf_counter(), done, _cpu_s(), [_cpu_s(p) for p in self.daemons]))

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._sample()

    def __enter__(self):
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()

    def quarters(self, lines: int) -> list:
        """(wall ms per line, client CPU ms per line, [each daemon's CPU ms per line]) of each quarter of the run."""
        out, prev = [], self.samples[0]
        for q in range(1, 5):
            cut = next((s for s in self.samples if s[1] >= q * lines / 4), self.samples[-1])
            n = max(1, cut[1] - prev[1])
            out.append((1e3 * (cut[0] - prev[0]) / n, 1e3 * (cut[2] - prev[2]) / n,
                        [1e3 * (b - a) / n for a, b in zip(prev[3], cut[3])]))
            prev = cut
        return out


def _run(models, split, boards, results, lines, daemons=()):
    t0 = time.perf_counter()
    with _Sampler(results, list(daemons)) as sampler:
        rep = evaluate(models, split, results, sides=("board",), boards=boards, pages=0, lines=lines,
                       progress=False, echo=lambda s: None)
    return time.perf_counter() - t0, rep, sampler.quarters(lines)


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
    load_start = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-ocr-farm-") as tmp:
        t0 = time.perf_counter()
        split = dataset.make(tmp, seed=args.seed, n_pages=0, n_lines=args.lines, split="evaluation")
        print(f"{args.lines} line images made in {time.perf_counter() - t0:.1f} s")
        with local_boards(2, tmp, echo=lambda s: None) as (a, b):
            daemons = _children()
            # one warm-up item per board (upload + load of the three .bin, first-run allocations)
            _run(models, split, [a], os.path.join(tmp, "warm_a.jsonl"), 1)
            _run(models, split, [b], os.path.join(tmp, "warm_b.jsonl"), 1)
            one_s, one, one_q = _run(models, split, [a], os.path.join(tmp, "one.jsonl"), args.lines, daemons)
            two_s, two, two_q = _run(models, split, [a, b], os.path.join(tmp, "two.jsonl"), args.lines, daemons)
    same = one.scores["board"] == two.scores["board"]
    print(f"load average {load_start} at the start, {load_average()} at the end; {os.cpu_count()} cores")
    if autogroup_on():
        print("kernel.sched_autogroup_enabled=1: the client and both boards share one session's part of the cores "
              "against the machine's other busy sessions")
    print(f"1 board : {one_s:7.1f} s  {args.lines / one_s:6.1f} images/s")
    print(f"2 boards: {two_s:7.1f} s  {args.lines / two_s:6.1f} images/s  ("
          + ", ".join(f"{s.name}: {s.items} images, {1e3 * s.busy_s / max(1, s.items):.0f} ms each" for s in two.boards)
          + ")")
    if daemons:
        print("by quarter of each run, per line: wall ms | CPU ms of this client + each daemon (flat CPU with moving "
              "wall: the machine's load, not the run)")
        for name, quarters in (("1 board ", one_q), ("2 boards", two_q)):
            print(f"  {name}: " + "; ".join(
                f"{w:5.1f} | {c:4.1f} + " + " + ".join(f"{d:4.1f}" for d in ds) for w, c, ds in quarters))
        cpu_two = sum(c + sum(ds) for _, c, ds in two_q) / 4
        print(f"2 boards cost {cpu_two:.1f} ms of CPU per line in all: on two free cores at best {cpu_two / 2:.1f} ms "
              f"per line, {1e3 * one_s / args.lines / (cpu_two / 2):.2f}x the 1-board run's "
              f"{1e3 * one_s / args.lines:.1f} ms")
    ratio = one_s / two_s
    print(f"speed-up 2 boards / 1 board: {ratio:.2f}x (goal {args.goal}x); metrics identical: {same}")
    return 0 if ratio >= args.goal and same else 1


if __name__ == "__main__":
    sys.exit(main())
