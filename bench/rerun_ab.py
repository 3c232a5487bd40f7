#!/usr/bin/env python3
"""A/B of makertbin converting again (statistics cached) between two checkouts of bpuemu, in one run.

    python bench/rerun_ab.py --before /path/to/old/checkout [--after .] [--models det] [--det-size 640]
                             [--samples 100] [--rounds 3]

The same yaml and calibration pages as bench/convert.py (its ``make_cases``,
``write_cal_dir`` and ``write_yaml``: PP-OCRv4 det by default) are converted by
``makertbin_from_config`` in a fresh Python process per run, with the package
of the ``--before`` or the ``--after`` checkout first on the path (each
checkout's common/, board/ and host/ seen as ``bpuemu``, as the editable
install lays them out), each side with its own calibration statistics cache
filled by an untimed first conversion. The sides alternate over ``--rounds``
rounds (before, after, then after, before, ...), so a load that drifts weighs
on both alike. Each run prints its wall and CPU seconds, its peak RSS and
makertbin's time by stage (``Artifacts.stages``, when the checkout has it);
then the medians per side, and whether both sides printed the same cosine table
and wrote the same artifacts (the .bin compared without the working_dir it
records). ``--first`` times first conversions instead (the statistics cache off
for every timed run; the untimed first conversion then only warms up).

Latest figure (bench/RESULTS.md): det 640 x 100, 3 rounds, median wall 20.55 -> 16.36 s (0.80x) over
the cosine table's compiled cosines and the search's sessions opened once each.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

#: What each run executes: one conversion, its figures as one JSON line.
CHILD = r"""
import hashlib, json, logging, resource, sys, time
logging.basicConfig(level=logging.ERROR)
t0, c0 = time.perf_counter(), time.process_time()
from bpuemu.host.mapper.makertbin import makertbin_from_config
art = makertbin_from_config(sys.argv[1])
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
onnx_files = [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in (art.original, art.optimized, art.calibrated, art.quantized)]
from bpuemu.common.container import read_bin
b = read_bin(art.bin)
for m in b.manifest.models:
    for kv in m.build_info.model_parameters:
        if kv.key == "working dir":
            kv.value = ""
bin_hash = hashlib.sha256(b.manifest.SerializeToString(deterministic=True) + b"".join(b.blobs[k] for k in sorted(b.blobs))).hexdigest()
print(json.dumps({"wall": wall, "cpu": cpu, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "stages": getattr(art, "stages", {}), "table": art.table, "files": onnx_files + [bin_hash]}))
"""


def package_dir(checkout: str, work: str, tag: str) -> str:
    """A directory holding ``bpuemu`` as ``checkout``'s common/, board/ and host/ (symlinks)."""
    root = os.path.join(work, f"pkg_{tag}")
    pkg = os.path.join(root, "bpuemu")
    os.makedirs(pkg, exist_ok=True)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    for part in ("common", "board", "host"):
        os.symlink(os.path.join(os.path.abspath(checkout), part), os.path.join(pkg, part))
    return root


def convert(yaml_path: str, env: Dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, yaml_path], env=env, cwd=os.path.dirname(yaml_path),
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"a conversion failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="a checkout of bpuemu (the A side)")
    ap.add_argument("--after", default=os.path.dirname(HERE), help="a checkout of bpuemu (the B side; default: this one)")
    ap.add_argument("--models", default="det", help="one of bench/convert.py's models: sample, cls, det")
    ap.add_argument("--det-size", type=int, default=640)
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--first", action="store_true",
                    help="time first conversions instead: every timed run computes its statistics (cache off)")
    args = ap.parse_args(argv)

    import convert as bench

    log = lambda s: print(s, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="bpuemu-bench-rerun-ab-") as work:
        case = bench.make_cases([args.models], work, args.samples, 1, args.det_size)[0]
        cal = bench.write_cal_dir(case, work)
        sides = {"before": args.before, "after": args.after}
        envs = {tag: dict(os.environ, PYTHONPATH=package_dir(path, work, tag),
                          BPUEMU_CALIBRATION_CACHE=os.path.join(work, f"cache_{tag}")) for tag, path in sides.items()}
        log(f"{case.name} 1x3x{case.height}x{case.width}, {args.samples} samples; before {args.before}, after {args.after}; "
            f"{os.cpu_count()} CPU(s)")
        for tag in sides:
            t0 = time.perf_counter()
            convert(bench.write_yaml(case, work, "default", cal, f"_{tag}_first"), envs[tag])
            log(f"{tag}: first conversion (statistics computed and cached, not timed here) {time.perf_counter() - t0:.1f} s")
        if args.first:
            envs = {tag: dict(env, BPUEMU_CALIBRATION_CACHE="off") for tag, env in envs.items()}
        runs: Dict[str, List[dict]] = {tag: [] for tag in sides}
        for r in range(args.rounds):
            for tag in (list(sides) if r % 2 == 0 else list(reversed(list(sides)))):
                x = convert(bench.write_yaml(case, work, "default", cal, f"_{tag}_{r}"), envs[tag])
                runs[tag].append(x)
                log(f"{tag} round {r + 1}/{args.rounds}: wall {x['wall']:.2f} s, CPU {x['cpu']:.2f} s, peak {x['rss']:.0f} MB, "
                    f"load {os.getloadavg()[0]:.2f}; " + ", ".join(f"{k} {w:.2f} s" for k, (w, _) in x["stages"].items()))
        all_runs = runs["before"] + runs["after"]
        log(f"same cosine table: {all(x['table'] == all_runs[0]['table'] for x in all_runs)}; same artifacts "
            f"(four ONNX files; the .bin without its working_dir): {all(x['files'] == all_runs[0]['files'] for x in all_runs)}")
        for tag, v in runs.items():
            stages = {k: (statistics.median(x["stages"][k][0] for x in v), statistics.median(x["stages"][k][1] for x in v))
                      for k in v[0]["stages"]}
            log(f"{tag}: median wall {statistics.median(x['wall'] for x in v):.2f} s, CPU {statistics.median(x['cpu'] for x in v):.2f} s, "
                f"peak {max(x['rss'] for x in v):.0f} MB; by stage (wall, cores): "
                + ", ".join(f"{k} {w:.2f} s ({c / w if w else 0:.2f})" for k, (w, c) in stages.items()))
        b, a = (statistics.median(x["wall"] for x in runs[t]) for t in ("before", "after"))
        log(f"after / before wall: {a / b:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
