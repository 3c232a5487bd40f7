#!/usr/bin/env python3
"""Uploads and infer over real links: one board per link profile, each in its own network namespace
(bench/netlab.py says what each profile does to packets and how), the client in the root namespace.

    sudo python bench/net_links.py [--profiles lan,wifi,bad] [--upload-mb 20] [--infers 40] [--size 64]

Per profile it prints:
- upload goodput: a model of --upload-mb MB (random bytes: nothing compresses) uploaded with BoardClient.upload,
  its Mbit/s, and that as a fraction of the link's rate and of raw TCP over the same link (one socket writing
  the same bytes to a sink inside the board's namespace, side by side in the same run). Goal: >= 0.8 of the
  link's rate on lan and wifi.
- infer latency: --infers infer calls of a sample model (--size x --size rgb input) on the board and on a local
  runtime in this process, interleaved; remote - local as median and p10-p90, against the profile's RTT + the
  transfer time of the request and reply bytes at its rate + 1 ms (goal: median within it).

- scaling (--scaling-boards N > 1): --scaling-items infers spread over N boards of the profile with the farm's
  failover map (bpuemu.board.farm.map_with_failover), items/s against one board's: over a link whose round trip
  dominates, N boards should serve close to N times as many items.

Exit status 1 when a goal is missed. The relay that emulates each link is a Python process: on lan its own
packet rate, not the nominal 1 Gbit/s, is the ceiling, which the raw TCP column shows.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netlab  # noqa: E402

from bpuemu.board.backends import LocalBackend  # noqa: E402
from bpuemu.board.client import BoardClient  # noqa: E402
from bpuemu.common.input_types import random_rt_input  # noqa: E402
from bpuemu.host.samples import sample_bin  # noqa: E402

GOODPUT_GOAL = 0.8
GOODPUT_PROFILES = ("lan", "wifi")
SINK_PORT = 9500
#: A TCP sink run inside a board's namespace: reads until EOF, then answers with the byte count.
SINK = ("import socket,sys\n"
        "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], int(sys.argv[2])))\n"
        "s.listen(1); print('ready', flush=True); s.settimeout(600); c,_=s.accept(); c.settimeout(600); n=0\n"
        "while True:\n    b=c.recv(1<<20)\n    if not b: break\n    n+=len(b)\n"
        "c.sendall(str(n).encode()); c.close()\n")


def raw_tcp_mbit(board: "netlab.Board", data: bytes) -> float:
    """Mbit/s of one TCP connection writing ``data`` to a sink in the board's namespace (until it acknowledges)."""
    sink = subprocess.Popen(["ip", "netns", "exec", board.namespace, sys.executable, "-c", SINK, board.address,
                             str(SINK_PORT)], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout.readline().strip() == "ready"
        start = time.monotonic()
        with socket.create_connection((board.address, SINK_PORT), timeout=60) as s:
            s.settimeout(600)
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            count = int(s.recv(64))
        seconds = time.monotonic() - start
        assert count == len(data)
        return len(data) * 8 / seconds / 1e6
    finally:
        sink.kill()
        sink.wait()


def scaling_rate(profile: str, boards: int, model_path: str, items: int, tmp: str) -> float:
    """Infers per second of ``items`` infers spread over ``boards`` boards behind ``profile`` links."""
    from bpuemu.board.farm import BoardAccess, FarmClient, map_with_failover

    with netlab.Lab([profile] * boards, workdir=os.path.join(tmp, f"scaling-{profile}-{boards}")) as lab, \
            FarmClient([b.target for b in lab.boards], [model_path], BoardAccess(token=lab.token)) as farm:
        handles = farm.board_models()
        x = random_rt_input(next(iter(handles.values())).model.input_specs[0], np.random.default_rng(1))
        for h in handles.values():
            h.infer([x])  # data channels open
        start = time.monotonic()
        done = sum(1 for _ in map_with_failover(handles, lambda h, _: h.infer([x]), range(items)))
        return done / (time.monotonic() - start)


def percentile(values, q: float) -> float:
    return float(np.percentile(values, q))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default="lan,wifi,bad")
    parser.add_argument("--upload-mb", type=float, default=20.0)
    parser.add_argument("--infers", type=int, default=40)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--scaling-boards", type=int, default=4)
    parser.add_argument("--scaling-items", type=int, default=80)
    args = parser.parse_args()
    why = netlab.unavailable()
    if why:
        print(f"net_links: {why}", file=sys.stderr)
        return 1
    profiles = args.profiles.split(",")
    missed = []
    with tempfile.TemporaryDirectory(prefix="bpuemu-net-links-") as tmp:
        small = os.path.join(tmp, "sample.bin")
        sample_bin(small, input_type_rt="rgb", height=args.size, width=args.size)
        big = os.path.join(tmp, "upload.bin")
        netlab.padded_model(small, big, int(args.upload_mb * 1e6))
        with open(big, "rb") as f:
            data = f.read()
        with netlab.Lab(profiles, workdir=os.path.join(tmp, "lab"), max_seconds=1800) as lab, \
                LocalBackend([small]) as local:
            model = local.model()
            x = random_rt_input(model.model.input_specs[0], np.random.default_rng(0))
            local_out = model.infer([x]).outputs
            for board in lab.boards:
                p = board.profile
                with BoardClient(board.target, token=lab.token) as client:
                    client.info
                    start = time.monotonic()
                    client.upload(big)
                    seconds = time.monotonic() - start
                    mbit = len(data) * 8 / seconds / 1e6
                    raw = raw_tcp_mbit(board, data)
                    ratio = mbit * 1e6 / p.rate_bps
                    print(f"[{p.name}] upload {len(data) / 1e6:.1f} MB: {seconds:.2f} s, {mbit:.1f} Mbit/s = "
                          f"{ratio:.2f} of the link's {p.rate_bps / 1e6:g} Mbit/s, {mbit / raw:.2f} of raw TCP "
                          f"({raw:.1f} Mbit/s)", flush=True)
                    if p.name in GOODPUT_PROFILES and ratio < GOODPUT_GOAL:
                        missed.append(f"{p.name} upload goodput {ratio:.2f} < {GOODPUT_GOAL}")
                    sha = client.ensure_model(small)
                    client.load(sha)
                    client.infer(sha, "", [x])  # the data channel opened, the model warm
                    remote, here = [], []
                    for _ in range(args.infers):
                        t = time.perf_counter()
                        out = client.infer(sha, "", [x]).outputs
                        remote.append((time.perf_counter() - t) * 1e3)
                        t = time.perf_counter()
                        model.infer([x])
                        here.append((time.perf_counter() - t) * 1e3)
                    assert out.keys() == local_out.keys()
                    assert all(np.array_equal(out[k], local_out[k]) for k in out)
                    extra = [r - h for r, h in zip(remote, here)]
                    moved = x.nbytes + sum(o.nbytes for o in out.values())
                    bound = (p.rtt_s + p.transfer_s(moved)) * 1e3 + 1.0
                    med = statistics.median(extra)
                    print(f"[{p.name}] infer: remote - local median {med:.2f} ms (p10 {percentile(extra, 10):.2f}, "
                          f"p90 {percentile(extra, 90):.2f}); bound RTT {p.rtt_s * 1e3:g} ms + {moved} B at "
                          f"{p.rate_bps / 1e6:g} Mbit/s + 1 ms = {bound:.2f} ms; local median "
                          f"{statistics.median(here):.2f} ms", flush=True)
                    if med > bound:
                        missed.append(f"{p.name} infer remote - local {med:.2f} ms > {bound:.2f} ms")
        if args.scaling_boards > 1:
            for name in profiles:
                one, many = (scaling_rate(name, n, small, args.scaling_items, tmp) for n in (1, args.scaling_boards))
                print(f"[{name}] scaling: {args.scaling_items} infers over 1 board {one:.1f}/s, over "
                      f"{args.scaling_boards} boards {many:.1f}/s = {many / one:.2f}x", flush=True)
    print("RESULT: " + ("PASS" if not missed else "MISSED " + "; ".join(missed)))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
