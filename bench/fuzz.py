#!/usr/bin/env python3
"""Run the fuzz properties of tests/fuzz for a given time and print what was tried.

    python bench/fuzz.py --minutes 5 [--only grpc_methods] [--seed 1]

The properties are the ones CI runs with a fixed example budget (tests/fuzz:
the `.bin` reader, the yaml loader, hrt_model_exec/hb_verifier input files,
every gRPC method of a real hrt_boardd on loopback). Here each gets an equal
share of the time, run in batches of fresh random examples until its share is
used. Prints, per property: examples tried, failures found (distinct, after
hypothesis shrank them) and the first line of each failure.

Each property runs in a forked child process: a crash of the process itself
(numpy's loadtxt once died of SIGSEGV on a fuzzed text file) is counted as a
failure of that property, and the daemon (started here, in the parent) is
still stopped at the end.
"""
import argparse
import collections
import logging
import multiprocessing
import os
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
FUZZ = os.path.join(HERE, os.pardir, "tests", "fuzz")
sys.path.insert(0, FUZZ)

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402

BATCH = 200


NAMES = ("random_bytes", "damaged_file", "absurd_manifest", "yaml_documents", "hrt_model_exec_input_file",
         "hb_verifier_input_file", "grpc_methods")


def resources(tmp: str):
    """The sample models and the daemon the properties need (made once, in the parent)."""
    from bpuemu.host.samples import sample_bin

    import test_daemon_grpc

    bins = {}
    for kind in ("rgb", "nv12", "featuremap"):
        bins[kind] = os.path.join(tmp, f"sample_{kind}.bin")
        sample_bin(bins[kind], input_type_rt=kind, height=16, width=16)
    return bins, test_daemon_grpc.start_fuzz_daemon(os.path.join(tmp, "boardd"))


def all_properties(tmp: str, bins, daemon):
    """name -> (strategy, check) of every fuzz property (in the child: the gRPC channel is made after the fork)."""
    import test_bin_reader
    import test_daemon_grpc
    import test_input_files
    import test_yaml_loader

    props = {}
    props.update(test_bin_reader.properties(bins["rgb"]))
    props.update(test_yaml_loader.properties(os.path.join(tmp, "yaml")))
    os.makedirs(os.path.join(tmp, "inputs"), exist_ok=True)
    props.update(test_input_files.properties(os.path.join(tmp, "inputs"), bins))
    props.update(test_daemon_grpc.properties(test_daemon_grpc.Target(daemon, [bins["rgb"], bins["featuremap"]])))
    return props


def run_in_child(name, tmp, bins, daemon, seconds, seed):
    """run_for of one property in a forked process: (examples, {failure: count}); a crash is a failure."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.SimpleQueue()
    tried = ctx.Value("q", 0)

    def child():
        strategy, check = all_properties(tmp, bins, daemon)[name]

        def counted(example):
            with tried.get_lock():
                tried.value += 1
            check(example)

        queue.put(run_for(strategy, counted, seconds, seed)[1])

    proc = ctx.Process(target=child)
    proc.start()
    proc.join(seconds + 300)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return tried.value, collections.Counter({"the property did not finish in time": 1})
    if proc.exitcode != 0:
        why = f"signal {-proc.exitcode}" if proc.exitcode < 0 else f"exit code {proc.exitcode}"
        return tried.value, collections.Counter({f"the process crashed ({why}) on an example": 1})
    return tried.value, queue.get()


def run_for(strategy, check, seconds: float, seed: int):
    """(examples tried, {failure line: count}) of ``check`` over ``strategy`` for about ``seconds``."""
    tried = 0
    failures = collections.Counter()
    end = time.monotonic() + seconds

    def counted(example):
        nonlocal tried
        tried += 1
        check(example)

    batch = 0
    while time.monotonic() < end:
        test = settings(max_examples=BATCH, deadline=None, database=None, derandomize=False,
                        suppress_health_check=list(HealthCheck))(given(strategy)(counted))
        test = hypothesis_seed(seed * 100003 + batch)(test)
        batch += 1
        try:
            test()
        except Exception as exc:  # a property failed: hypothesis shrank it and re-raised
            line = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
            failures[(line[0] if line else type(exc).__name__)[:300]] += 1
    return tried, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=1.0, help="total time, shared equally by the properties")
    parser.add_argument("--only", default="", help="run only this property (names are printed)")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    names = [n for n in NAMES if not args.only or n == args.only]
    if not names:
        print(f"no property {args.only!r}; there are: {', '.join(NAMES)}")
        return 2
    with tempfile.TemporaryDirectory(prefix="bpuemu-fuzz-") as tmp:
        bins, daemon = resources(tmp)
        try:
            share = args.minutes * 60 / len(names)
            print(f"fuzzing {len(names)} properties for {args.minutes:g} min ({share:.0f} s each), seed {args.seed}")
            total_failures = 0
            print(f"{'property':28s} {'examples':>9s} {'failures':>9s}")
            for name in names:
                tried, failures = run_in_child(name, tmp, bins, daemon, share, args.seed)
                total_failures += sum(failures.values())
                print(f"{name:28s} {tried:9d} {sum(failures.values()):9d}", flush=True)
                for line, count in failures.items():
                    print(f"    {count}x {line}")
            print(f"total failures: {total_failures}")
        finally:
            daemon.stop()
    return 1 if total_failures else 0


if __name__ == "__main__":
    sys.exit(main())
