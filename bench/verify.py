#!/usr/bin/env python3
"""Wall time of a three-way hb_verifier run on one 1x3x224x224 model, split by side.

    python bench/verify.py [--size 224] [--rounds 3] [--dump-all]

Builds the sample CNN (rgb input, 224x224), starts hrt_boardd on loopback in
its own process, and runs ``verify`` (quanti.onnx vs simulator vs board) as
hb_verifier does, --rounds times. Prints the medians of:

* host inference     quanti.onnx by HB_ONNXRuntime (session build apart)
* simulator inference  the .bin in the in-process runtime
* board inference    what the board reports its runtime spent
* transfer           board call wall time minus board inference (request,
                     reply, serialization); board setup (model upload when
                     the board lacks it, load) is shown apart
* compare            computing the three pairs' figures
"""
import argparse
import logging
import os
import statistics
import sys
import tempfile
import time

from bpuemu.host.samples.daemon import start_daemon
from bpuemu.host.samples import sample_bin
from bpuemu.host.verifier.core import VerifyOptions, verify


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dump-all", action="store_true", help="also dump and compare every node (-r True)")
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization chatter

    with tempfile.TemporaryDirectory(prefix="bpuemu-bench-verify-") as tmp:
        model = os.path.join(tmp, "sample.bin")
        quanti = os.path.join(tmp, "sample_quantized_model.onnx")
        t0 = time.perf_counter()
        sample_bin(model, input_type_rt="rgb", height=args.size, width=args.size, quantized_path=quanti)
        build_s = time.perf_counter() - t0
        proc, target = start_daemon(os.path.join(tmp, "models"), os.path.join(tmp, "hrt_boardd.log"))
        try:
            rows = []
            for _ in range(args.rounds):
                marks = {}

                def echo(line, marks=marks):
                    if line.startswith("INFO ***"):  # the first pair's header: the compares start
                        marks.setdefault("compare", time.perf_counter())

                t0 = time.perf_counter()
                report = verify(VerifyOptions(bin_model=model, quanti_model=quanti, run_sim=True, boards=[target],
                                              dump_all=args.dump_all), echo=echo)
                end = time.perf_counter()
                total = end - t0
                assert report.passed, report.text()
                sides = {s.label: s for s in report.sides}
                compare_s = end - marks["compare"]
                rows.append({
                    "host inference": sides["Quanti.onnx"].infer_ms,
                    "simulator inference": sides["Sim"].infer_ms,
                    "board inference": sides["Arm"].compute_ms,
                    "transfer": sides["Arm"].transfer_ms,
                    "board setup (upload + load)": sides["Arm"].setup_ms,
                    "compare": compare_s * 1e3,
                    "total wall": total * 1e3,
                })
        finally:
            proc.terminate()
            proc.wait(20)

    print(f"three-way verify of a 1x3x{args.size}x{args.size} model (rgb, sample CNN; built in {build_s:.1f} s), "
          f"board = hrt_boardd on loopback; median of {args.rounds} round(s)"
          + (", with -r (every node dumped)" if args.dump_all else ""))
    for key in rows[0]:
        values = [r[key] for r in rows]
        print(f"  {key:<28s} {statistics.median(values):9.2f} ms   (rounds: {', '.join(f'{v:.2f}' for v in values)})")
    print("  (board setup: the first round uploads the model; later rounds find it in the board's store and only load it)")


if __name__ == "__main__":
    sys.exit(main())
