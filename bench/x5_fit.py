#!/usr/bin/env python3
"""Fit the X5 timing model's parameters to published RDK X5 measurements (re-runnable).

    python bench/x5_timing.py --set fit          # first: convert the fit set's models (needs .[x5bench])
    python bench/x5_fit.py                       # fit and print the figures
    python bench/x5_fit.py --write               # ... and write the fitted values into the parameter table
    python bench/x5_fit.py --evaluate            # no fit: the current parameters' figures
    python bench/x5_fit.py --csv my.csv --cache DIR
    python bench/x5_fit.py --csv bench/x5_fit.csv,bench/x5_check.csv --bins CACHE/bin_nv12   # the union, nv12

Inputs: the published figures (``--csv``, default bench/x5_fit.csv: 1-thread latency, FPS at
``threads``) and each model's `.bin` converted with ``hb_mapper makertbin --fast-perf``, as
bench/x5_timing.py converts them into its cache (``--cache``, default x5_timing's, the featuremap
.bins under DIR/bin/<model>/; ``--bins`` names such a folder directly). The procedure:

1. Features, once per `.bin` (cached beside it as x5_features.pkl, keyed by the file's SHA-256):
   every BPU layer's kind, work, DDR bytes and fusion, every other plan step's kind and elements,
   the model's output bytes (bpuemu.host.compiler.timing.estimate.plan_features). They do not
   depend on the fitted parameters.
2. The model of a frame from features and parameters (estimate.plan_times, the same formulas
   hb_perf and makertbin use; checked here against estimate_model on the first model), scheduled
   like ``hrt_model_exec perf`` (bpuemu.common.x5_timing.schedule, 200 frames).
3. Least squares (Levenberg-Marquardt on the log of the parameters, numpy only) of the log errors
   of each model's 1-thread latency and FPS at its published thread count, every model weighted
   alike (a model missing a figure has one residual, weighted up to count as one model), with a
   weak pull of each parameter towards its starting value (ridge 0.01 on log scale) so that a
   parameter the data cannot see stays where physics put it; the CPU parameters (x5.NOT_FITTED) are
   not fitted at all: the fast-perf fit set runs everything on the BPU. Where a row publishes the real
   compiler's estimate line (``compiler_est_latency_us``), makertbin's BPU-only latency is held against
   it as one more residual: it separates the BPU's time from the runtime's.
4. Held-out figures: the same fit K times, each leaving a fold of models out and predicting them
   (5-fold): what the model does on models not used for fitting; overall and per architecture
   family (bench/x5_timing.py's FAMILIES).
5. With ``--write`` only: the fitted values are written into host/compiler/timing/x5.py between
   its FITTED markers, with the date.
"""
import argparse
import csv
import datetime
import glob
import hashlib
import os
import pickle
import re
import sys
from typing import Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from x5_timing import DEFAULT_CACHE, FAMILIES, SETS, Cache, arch_family  # noqa: E402  (bench/x5_timing.py)

#: The published figures the project ships (bench/x5_fit.csv).
DEFAULT_CSV = SETS["fit"]
#: Each parameter stays within this factor (e**BOUND = 100x) of its physical starting value.
BOUND = np.log(100.0)
X5_PY = os.path.join(ROOT, "host", "compiler", "timing", "x5.py")


def read_rows(path: str) -> List[dict]:
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            threads = re.match(r"\d+", r.get("threads") or "")
            rows.append({"model": r["model"], "family": r.get("family", ""), "source": r.get("architecture_source", ""),
                         "lat1": float(r["x5_latency_1thread_ms"]) if r.get("x5_latency_1thread_ms") else None,
                         "fps": float(r["x5_fps"]) if r.get("x5_fps") and threads else None,
                         "threads": int(threads.group()) if threads else 4,
                         # the real compiler's estimate line (BPU only), where published: a second target
                         "est_us": float(r["compiler_est_latency_us"]) if r.get("compiler_est_latency_us") else None})
    return rows


def find_bin(bins: str, model: str):
    hits = sorted(glob.glob(os.path.join(bins, model, "*.bin")))
    return hits[0] if hits else None


def features_of(path: str):
    """The model's plan features, cached beside the .bin (keyed by its SHA-256 and the extractor's version)."""
    from bpuemu.common.container import read_bin
    from bpuemu.host.compiler.timing.estimate import FEATURES_VERSION, plan_features

    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    cache = os.path.join(os.path.dirname(path), "x5_features.pkl")
    key = (sha, FEATURES_VERSION)
    if os.path.exists(cache):
        try:
            with open(cache, "rb") as f:
                cached = pickle.load(f)
            if cached[0] == key:
                return cached[1]
        except Exception:  # a stale or broken cache is rebuilt
            pass
    b = read_bin(path)
    feat = plan_features(b.model(), b.blobs)
    with open(cache + ".tmp", "wb") as f:
        pickle.dump((key, feat), f)
    os.replace(cache + ".tmp", cache)
    return feat


def predict(feat, bpu, threads: int):
    from bpuemu.common import x5_timing
    from bpuemu.host.compiler.timing.estimate import plan_times

    steps = plan_times(feat, bpu)
    run = x5_timing.schedule(steps, threads, 200)
    return run.latency_1thread_ms, run.fps, steps.bpu_us


class Fit:
    def __init__(self, names: List[str], start: Dict[str, float], ridge: float = 0.01):
        self.names, self.start, self.ridge = names, start, ridge
        self.x0 = np.log([start[n] for n in names])

    def bpu(self, x):
        from bpuemu.host.compiler.timing.x5 import X5_BPU

        return X5_BPU.with_values(**dict(zip(self.names, np.exp(x).tolist())))

    def residuals(self, x, data):
        bpu = self.bpu(x)
        res = []
        for row, feat in data:
            lat, fps, bpu_us = predict(feat, bpu, row["threads"])
            have = [v for v in (row["lat1"], row["fps"]) if v]
            w = 1.0 if len(have) == 2 else np.sqrt(2.0)
            if row["lat1"]:
                res.append(w * np.log(lat / row["lat1"]))
            if row["fps"]:
                res.append(w * np.log(fps / row["fps"]))
            if row.get("est_us"):       # makertbin's line (the BPU's time) against the real compiler's
                res.append(np.log(bpu_us / row["est_us"]))
        res.extend(np.sqrt(self.ridge) * (x - self.x0))
        return np.asarray(res)

    def solve(self, data, iterations: int = 40, x=None):
        """Levenberg-Marquardt on log-parameters (forward-difference Jacobian)."""
        x = self.x0.copy() if x is None else x.copy()
        r = self.residuals(x, data)
        lam, cost = 1e-2, float(r @ r)
        for _ in range(iterations):
            J = np.empty((len(r), len(x)))
            for j in range(len(x)):
                dx = np.zeros_like(x)
                dx[j] = 1e-4
                J[:, j] = (self.residuals(x + dx, data) - r) / 1e-4
            A, g = J.T @ J, J.T @ r
            improved = False
            for _ in range(8):
                step = -np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-9), g)
                step = np.clip(step, -2.0, 2.0)
                xn = np.clip(x + step, self.x0 - BOUND, self.x0 + BOUND)
                rn = self.residuals(xn, data)
                cn = float(rn @ rn)
                if cn < cost:
                    x, r, cost, lam, improved = xn, rn, cn, max(lam / 3, 1e-6), True
                    break
                lam *= 4
            if not improved or np.max(np.abs(step)) < 1e-4:
                break
        return x, cost


def stats(errors: List[float]) -> dict:
    e = np.abs(np.asarray(errors, dtype=float))
    if not len(e):
        return {"n": 0}
    return {"n": len(e), "median": float(np.median(e)), "within15": float(np.mean(e <= 0.15)),
            "within20": float(np.mean(e <= 0.20)), "within25": float(np.mean(e <= 0.25))}


def spearman(a, b) -> float:
    if len(a) < 3:
        return float("nan")
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def table(title: str, results: List[dict]) -> str:
    out = [f"== {title} ==", f"{'model':<22} {'thr':>3} {'pub FPS':>9} {'model FPS':>9} {'FPS err':>8} "
           f"{'pub lat1':>8} {'mod lat1':>8} {'lat err':>8}"]
    for r in results:
        fe = f"{r['fps_err']:+.0%}" if r["fps_err"] is not None else "--"
        le = f"{r['lat_err']:+.0%}" if r["lat_err"] is not None else "--"
        out.append(f"{r['model']:<22} {r['threads']:>3} {r['pub_fps'] or 0:>9.1f} {r['fps']:>9.1f} {fe:>8} "
                   f"{r['pub_lat1'] or 0:>8.2f} {r['lat1']:>8.2f} {le:>8}")
    fps_e = [r["fps_err"] for r in results if r["fps_err"] is not None]
    lat_e = [r["lat_err"] for r in results if r["lat_err"] is not None]
    sf, sl = stats(fps_e), stats(lat_e)
    pairs = [(r["pub_fps"], r["fps"]) for r in results if r["pub_fps"]]
    rho = spearman([p for p, _ in pairs], [m for _, m in pairs])
    lpairs = [(r["pub_lat1"], r["lat1"]) for r in results if r["pub_lat1"]]
    rho_l = spearman([p for p, _ in lpairs], [m for _, m in lpairs])
    if sf["n"]:
        out.append(f"FPS: n={sf['n']} median |err| {sf['median']:.1%}, within 15% {sf['within15']:.0%}, "
                   f"within 20% {sf['within20']:.0%}, within 25% {sf['within25']:.0%}, Spearman {rho:.3f}")
    if sl["n"]:
        out.append(f"1-thread latency: n={sl['n']} median |err| {sl['median']:.1%}, within 15% {sl['within15']:.0%}, "
                   f"within 20% {sl['within20']:.0%}, within 25% {sl['within25']:.0%}, Spearman {rho_l:.3f}")
    est_e = [r["est_err"] for r in results if r.get("est_err") is not None]
    if est_e:
        se = stats(est_e)
        out.append(f"makertbin's line vs the real compiler's (compiler_est_latency_us): n={se['n']} median |err| "
                   f"{se['median']:.1%}, within 20% {se['within20']:.0%}")
    for fam, _ in FAMILIES:
        sub = [r for r in results if r.get("arch") == fam]
        ff = stats([r["fps_err"] for r in sub if r["fps_err"] is not None])
        fl = stats([r["lat_err"] for r in sub if r["lat_err"] is not None])
        if ff["n"]:
            pairs = [(r["pub_fps"], r["fps"]) for r in sub if r["pub_fps"]]
            out.append(f"  {fam:<10} n={ff['n']:<3} FPS median |err| {ff['median']:.1%}, within 20% {ff['within20']:.0%}, "
                       f"Spearman {spearman([p for p, _ in pairs], [m for _, m in pairs]):.3f}; latency median |err| "
                       f"{fl['median'] if fl['n'] else float('nan'):.1%}")
    return "\n".join(out)


def evaluate(data, bpu) -> List[dict]:
    out = []
    for row, feat in data:
        lat, fps, bpu_us = predict(feat, bpu, row["threads"])
        out.append({"model": row["model"], "arch": row.get("arch", ""), "threads": row["threads"], "pub_fps": row["fps"], "fps": fps,
                    "fps_err": fps / row["fps"] - 1 if row["fps"] else None, "pub_lat1": row["lat1"], "lat1": lat,
                    "lat_err": lat / row["lat1"] - 1 if row["lat1"] else None,
                    "est_err": bpu_us / row["est_us"] - 1 if row.get("est_us") else None})
    return out


def write_parameters(values: Dict[str, float], source: str, path: str = X5_PY) -> None:
    text = open(path).read()
    begin, end = text.index("# FITTED-BEGIN"), text.index("# FITTED-END")
    head = text[begin:].split("\n", 1)[0]
    body = [head, f"FIT_SOURCE = {source!r}", "FITTED_VALUES = {"]
    body += [f"    {name!r}: {value:.6g}," for name, value in values.items()]
    body += ["}", ""]
    with open(path, "w") as f:
        f.write(text[:begin] + "\n".join(body) + text[end:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", default=DEFAULT_CSV, help="published figures (default: bench/x5_fit.csv; several files: comma-separated)")
    ap.add_argument("--cache", default=DEFAULT_CACHE, help="bench/x5_timing.py's cache (its --cache)")
    ap.add_argument("--bins", help="the folder of <model>/*.bin (default: the cache's featuremap .bins)")
    ap.add_argument("--write", action="store_true",
                    help="write the fitted values into host/compiler/timing/x5.py's parameter table")
    ap.add_argument("--evaluate", action="store_true", help="no fit: the current parameters' figures")
    ap.add_argument("--folds", type=int, default=5, help="held-out folds (0: none)")
    ap.add_argument("--iterations", type=int, default=40)
    args = ap.parse_args(argv)
    if args.bins is None:
        args.bins = os.path.dirname(Cache(args.cache).bin_dir("-"))

    from bpuemu.common.container import read_bin
    from bpuemu.host.compiler.timing.estimate import estimate_model
    from bpuemu.host.compiler.timing.x5 import FITTED_VALUES, NOT_FITTED, START_VALUES, X5_BPU

    rows = [r for path in args.csv.split(",") for r in read_rows(path)]    # several csv files: comma-separated
    data, missing = [], []
    for row in rows:
        path = find_bin(args.bins, row["model"])
        if path is None:
            missing.append(row["model"])
            continue
        print(f"features: {row['model']}", file=sys.stderr, flush=True)
        row["arch"] = arch_family(path, row["source"])
        data.append((row, features_of(path)))
    if missing:
        print(f"no .bin yet for {len(missing)} model(s): {', '.join(missing)}", file=sys.stderr)
    if not data:
        print(f"ERROR no converted model found under {args.bins}: run python bench/x5_timing.py --set fit "
              f"--cache {args.cache} first (it needs pip install -e .[x5bench])", file=sys.stderr)
        return 1
    # the fit's formulas are the tools': check on the first model
    first_row = data[0][0]
    b = read_bin(find_bin(args.bins, first_row["model"]))
    ref = estimate_model(b.model(), b.blobs).modeled(first_row["threads"])
    lat, fps, _ = predict(data[0][1], X5_BPU, first_row["threads"])
    assert abs(lat - ref.latency_1thread_ms) < 1e-6 * max(1.0, lat) and abs(fps - ref.fps) < 1e-6 * max(1.0, fps), \
        (lat, ref.latency_1thread_ms, fps, ref.fps)

    names = [n for n in FITTED_VALUES if n not in NOT_FITTED]
    fit = Fit(names, dict(START_VALUES))
    if args.evaluate:
        print(table(f"current parameters on {len(data)} fit-set models", evaluate(data, X5_BPU)))
        return 0
    x, cost = fit.solve(data, args.iterations)
    fitted = dict(zip(names, np.exp(x).tolist()))
    print(table(f"fit set, in-sample ({len(data)} models)", evaluate(data, fit.bpu(x))))
    if args.folds and len(data) >= 2 * args.folds:
        held: List[dict] = []
        order = np.random.default_rng(0).permutation(len(data))
        for k in range(args.folds):
            test = [data[i] for i in order[k::args.folds]]
            train = [data[i] for i in order if i not in set(order[k::args.folds])]
            xk, _ = fit.solve(train, args.iterations, x)
            held += evaluate(test, fit.bpu(xk))
        held.sort(key=lambda r: r["model"])
        print(table(f"fit set, held out ({args.folds}-fold: each model predicted by a fit without it)", held))
    print("\nfitted parameters:")
    for n in names:
        print(f"  {n:<24} {fitted[n]:12.6g}   (start {START_VALUES[n]:g})")
    if args.write:
        today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        values = {n: (fitted[n] if n in fitted else START_VALUES[n]) for n in FITTED_VALUES}
        csvs = " + ".join(os.path.basename(c) for c in args.csv.split(","))
        kind = "nv12" if "nv12" in os.path.basename(os.path.normpath(args.bins)) else "featuremap"
        write_parameters(values, f"fitted by bench/x5_fit.py on {csvs} ({len(data)} models, {kind} .bins), {today}")
        print(f"\nwrote the fitted values into {X5_PY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
