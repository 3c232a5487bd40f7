#!/usr/bin/env python3
"""Load test of one board daemon: N concurrent clients, M infer calls each, for a bounded time.

    python bench/load.py [--clients 4] [--calls 200] [--max-seconds 60] [--size 64]
                         [--transport data|grpc|both] [--board HOST:PORT]

Starts its own hrt_boardd on loopback (or drives --board), uploads a sample
model, warms every client up with one call, then runs the clients at once:
each makes --calls infer calls (one BoardClient per client, so one connection
each) until it is done or --max-seconds have passed. Prints throughput, p50 and
p99 latency, the error count, and the daemon's resident memory (VmRSS, from
/proc/<pid>/status for a daemon started here, from GetStats for --board)
before and after.

Goals (exit status 1 when one is missed):
- zero errors;
- the board served exactly the calls the clients made (its GetStats counters);
- RSS growth over the run at most --rss-bound-mb (default 32 MB). "Before" is
  taken after the warm-up, so loading the model and the first call's
  allocations are not counted: what is left is what the steady state leaks or
  grows by. The default bound is ~30% of an idle daemon (~95 MB) and far below
  what one leaked frame per call would cost (N x M x input size).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import List

import numpy as np

from bpuemu.board.client import BoardClient
from bpuemu.common.errors import BpuEmuError
from bpuemu.common.input_types import random_rt_input
from bpuemu.host.samples.daemon import start_daemon


def vm_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass
class ClientRun:
    latencies_ms: List[float] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)


def run_clients(target: str, sha: str, x: np.ndarray, clients: int, calls: int, max_seconds: float,
                data_channel: bool) -> tuple:
    """(runs, wall seconds): every client makes ``calls`` calls or stops at the time cap."""
    boards = [BoardClient(target, client_name="bench-load", data_channel=data_channel) for _ in range(clients)]
    for b in boards:  # warm-up: connect, handshake, open the data channel
        b.infer(sha, "", [x])
    runs = [ClientRun() for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(board: BoardClient, run: ClientRun):
        start.wait()
        for _ in range(calls):
            if time.monotonic() > stop_at[0]:
                break
            t0 = time.perf_counter()
            try:
                board.infer(sha, "", [x])
                run.latencies_ms.append((time.perf_counter() - t0) * 1e3)
            except BpuEmuError as exc:
                run.errors.append(exc.message.splitlines()[0])

    threads = [threading.Thread(target=client, args=(b, r)) for b, r in zip(boards, runs)]
    for t in threads:
        t.start()
    stop_at[0] = time.monotonic() + max_seconds
    t0 = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for b in boards:
        b.close()
    return runs, wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=4, help="concurrent clients (N)")
    p.add_argument("--calls", type=int, default=200, help="infer calls per client (M)")
    p.add_argument("--max-seconds", type=float, default=60.0, help="time cap of each run")
    p.add_argument("--size", type=int, default=64, help="input height and width of the sample model")
    p.add_argument("--transport", choices=["data", "grpc", "both"], default="both",
                   help="the data channel (what clients use by default), gRPC Infer, or one run of each")
    p.add_argument("--board", default="", help="drive this daemon instead of starting one (RSS from GetStats)")
    p.add_argument("--rss-bound-mb", type=float, default=32.0, help="largest acceptable RSS growth")
    args = p.parse_args()
    if args.clients < 1 or args.calls < 1 or args.max_seconds <= 0:
        sys.exit("--clients, --calls and --max-seconds must be positive")

    from bpuemu.host.samples import sample_bin  # host-side: builds the sample model

    with tempfile.TemporaryDirectory(prefix="bpuemu-load-") as workdir:
        return run(args, workdir, sample_bin)


def run(args, workdir: str, sample_bin) -> int:
    proc = None
    if args.board:
        target = args.board
    else:
        proc, target = start_daemon(os.path.join(workdir, "models"), os.path.join(workdir, "hrt_boardd.log"),
                                    extra_args=("--max-jobs", str(args.clients), "--log-level", "WARNING"))
    try:
        model_path = os.path.join(workdir, "load.bin")
        sample_bin(model_path, input_type_rt="rgb", height=args.size, width=args.size)
        with BoardClient(target, client_name="bench-load") as admin:
            def rss() -> int:
                return vm_rss_bytes(proc.pid) if proc is not None else admin.stats().rss_bytes

            idle_rss = rss()
            sha = admin.ensure_model(model_path)
            admin.load(sha)
            x = random_rt_input(admin.model_info(sha).input_specs[0], np.random.default_rng(0))
            print(f"board {target} ({admin.info.arch}, bpuemu {admin.info.daemon_version}); model {args.size}x{args.size} "
                  f"rgb, input {x.nbytes} bytes; {args.clients} clients x {args.calls} calls, cap {args.max_seconds:g} s")
            transports = ["data", "grpc"] if args.transport == "both" else [args.transport]
            rss_before = None
            failed = False
            for transport in transports:
                stats_before = admin.stats()
                if rss_before is None:
                    # after one warm-up call per client, so loading and first-call allocations are not counted
                    run_clients(target, sha, x, args.clients, 1, args.max_seconds, transport == "data")
                    stats_before = admin.stats()
                    rss_before = rss()
                runs, wall = run_clients(target, sha, x, args.clients, args.calls, args.max_seconds, transport == "data")
                stats_after = admin.stats()
                lat = sorted(t for r in runs for t in r.latencies_ms)
                errors = [e for r in runs for e in r.errors]
                made = len(lat) + len(errors)
                served = stats_after.infer_calls - stats_before.infer_calls - args.clients  # minus the warm-ups
                capped = made < args.clients * args.calls
                print(f"\n[{'data channel' if transport == 'data' else 'gRPC Infer'}] {made} calls in {wall:.2f} s"
                      f"{' (stopped at the time cap)' if capped else ''}")
                print(f"  throughput : {len(lat) / wall:10.1f} calls/s")
                if lat:
                    print(f"  latency    : p50 {np.percentile(lat, 50):.3f} ms, p99 {np.percentile(lat, 99):.3f} ms, "
                          f"mean {statistics.fmean(lat):.3f} ms, max {lat[-1]:.3f} ms")
                print(f"  errors     : {len(errors)}" + (f" (first: {errors[0]})" if errors else ""))
                print(f"  board served {served} of them (GetStats), {stats_after.infer_errors - stats_before.infer_errors} "
                      f"with an error")
                if errors or served != made:
                    failed = True
            rss_after = rss()
        growth = (rss_after - rss_before) / 2 ** 20
        print(f"\ndaemon RSS  : idle {idle_rss / 2 ** 20:.1f} MB, before {rss_before / 2 ** 20:.1f} MB, "
              f"after {rss_after / 2 ** 20:.1f} MB, growth {growth:+.1f} MB (bound {args.rss_bound_mb:g} MB)")
        if growth > args.rss_bound_mb:
            failed = True
        print("RESULT      : " + ("FAIL" if failed else "PASS (zero errors, every call served, RSS growth within bound)"))
        return 1 if failed else 0
    except BpuEmuError as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    sys.exit(main())
