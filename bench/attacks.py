#!/usr/bin/env python3
"""hrt_boardd's peak memory under the attacks of issue 34, against the limit each defence sets, with an honest
client served during each.

    python bench/attacks.py [--python PYTHON] [--bomb-mib 32] [--announced 32]

Starts its own hrt_boardd processes on loopback (``PYTHON -m bpuemu.board.daemon``, this interpreter by
default; ``--python`` runs another checkout's daemon side by side) and runs, one at a time:

1. external-data : upload a .bin whose piece keeps a weight as ONNX external data (a file beside the daemon),
                   then load a copy planted in the store
2. unauth-bomb   : an Infer of --bomb-mib MiB whose tensor shape is that many packed varints, without the token
   auth-bomb     : the same with the token (parsed, it would be 8 bytes per varint)
   data-bomb     : the same on the data channel, with the token
3. stalled-calls : 16 calls that never send their request over 2 connections, and 16 Health.Watch streams
4. announced     : --announced data channel connections each announcing a 256 MiB frame and sending nothing
   sent          : 4 data channel frames of 40 MiB with 30 MiB of each sent and held (--max-data-buffer-mb 64)

The limits are the tests' (tests/board/test_attacks.py): a bomb with the token may cost 4x its size (the copies
gRPC makes of a message it receives; the parse that would take 8x is refused), a data channel frame what its
bytes take as they come, within --max-data-buffer-mb. For each: the daemon's resident memory before, its peak during the attack (/proc/PID/status VmHWM, reset
through /proc/PID/clear_refs first), the growth against the limit, how the attack ended, and whether three
honest infers (checked against the local runtime) were served during it. The figures go in the results
document with the command, date, commit and machine.
"""
import argparse
import os
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "board"))

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from attacks import (  # noqa: E402
    MIB, PeakMemory, StalledCalls, announce_infer, data_hello, external_data_bin, honest_infers, own_channel,
    raw_infer, sha_of, varint_bomb,
)
from boardd_harness import Daemon, clean_env  # noqa: E402
from bpuemu.common.wire import INFER, pack_frame, read_frame  # noqa: E402

TOKEN = "bench-token-for-the-attacks-0123456789"


class Sample:
    def __init__(self, directory: str):
        from bpuemu.common.container import read_bin
        from bpuemu.common.input_types import random_rt_input
        from bpuemu.host.samples import sample_bin

        self.path = os.path.join(directory, "sample.bin")
        sample_bin(self.path, input_type_rt="rgb", height=32, width=32)
        spec = read_bin(self.path).model().input_specs[0]
        self.x = random_rt_input(spec, np.random.default_rng(0))


def row(name: str, peak: PeakMemory, limit_mib: float, outcome: str, honest) -> None:
    served = f"{honest.served}/{honest.served + honest.failed}"
    print(f"{name:15s} {peak.start / MIB:8.0f} {peak.peak / MIB:8.0f} {peak.growth / MIB:8.1f} {limit_mib:8.0f}  "
          f"{served:7s} {outcome}", flush=True)


def start(python: str, workdir: str, *flags: str) -> Daemon:
    d = Daemon(workdir, *flags, env=clean_env())
    d.args[0] = python
    return d.start()


def external_data(python, work, sample):
    d = start(python, os.path.join(work, "d1"))
    try:
        bad = os.path.join(work, "steals.bin")
        external_data_bin(sample.path, bad, location="secret.txt")
        with open(os.path.join(d.workdir, "secret.txt"), "wb") as f, open(os.path.join(d.model_dir, "secret.txt"),
                                                                              "wb") as g:
            f.write(os.urandom(1 << 16))
            g.write(os.urandom(1 << 16))
        outcomes = []
        with PeakMemory(d.proc.pid) as peak, d.client() as board:
            for what, call in (("upload", lambda: board.upload(bad)),
                               ("load", lambda: (_plant(d, bad), board.load(sha_of(bad))))):
                try:
                    call()
                    outcomes.append(f"{what} accepted")
                except Exception as exc:
                    outcomes.append(f"{what} {type(exc).__name__}")
            honest = honest_infers(d, sample, None)
        row("external-data", peak, 64, ", ".join(outcomes), honest)
    finally:
        d.stop()


def _plant(d, path):
    import shutil

    shutil.copy(path, os.path.join(d.model_dir, f"{sha_of(path)}.bin"))


def bombs(python, work, sample, bomb_mib):
    token_file = os.path.join(work, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN)
    os.chmod(token_file, 0o600)
    d = start(python, os.path.join(work, "d2"), "--token-file", token_file)
    try:
        bomb = varint_bomb(bomb_mib * MIB)
        for name, token, limit in (("unauth-bomb", None, 16), ("auth-bomb", TOKEN, 4 * bomb_mib)):
            with own_channel(d.target) as channel:
                raw_infer(channel, b"", token)
                with PeakMemory(d.proc.pid) as peak:
                    code = raw_infer(channel, bomb, token)
                honest = honest_infers(d, sample, TOKEN)
            row(name, peak, limit, code.name, honest)
        s = data_hello(d.client(TOKEN).info.data_port, TOKEN, timeout=60)
        try:
            with PeakMemory(d.proc.pid) as peak:
                s.sendall(pack_frame(INFER, bomb))
                kind, payload = read_frame(s)
        finally:
            s.close()
        honest = honest_infers(d, sample, TOKEN)
        row("data-bomb", peak, 4 * bomb_mib, bytes(payload).split(b"\n")[0].decode(), honest)
    finally:
        d.stop()


def stalled(python, work, sample):
    d = start(python, os.path.join(work, "d3"), "--max-concurrent-rpcs", "16", "--call-deadline", "5")
    try:
        with PeakMemory(d.proc.pid) as peak, StalledCalls(d.target, 16, connections=2, watches=16) as attack:
            time.sleep(1.5)
            honest = honest_infers(d, sample, None)
            ended = attack.ended()
        summary = {code.name: ended.count(code) for code in set(ended)}
        row("stalled-calls", peak, 64, f"ended at once: {summary or 'none'}", honest)
    finally:
        d.stop()


def data_channel(python, work, sample, announced):
    token_file = os.path.join(work, "token")
    d = start(python, os.path.join(work, "d4"), "--token-file", token_file, "--max-data-buffer-mb", "64",
              "--max-data-connections", str(announced + 8))
    socks = []
    try:
        port = d.client(TOKEN).info.data_port
        with PeakMemory(d.proc.pid) as peak:
            for _ in range(announced):
                s = data_hello(port, TOKEN)
                announce_infer(s, 256 * MIB - 1)
                socks.append(s)
            time.sleep(0.5)
            honest = honest_infers(d, sample, TOKEN)
        row("announced", peak, 32, f"{announced} x 256 MiB announced", honest)
        for s in socks:
            s.close()
        socks.clear()
        refused = 0
        with PeakMemory(d.proc.pid) as peak:
            for _ in range(4):
                s = data_hello(port, TOKEN)
                socks.append(s)
                try:
                    announce_infer(s, 40 * MIB, send=30 * MIB)
                except OSError:
                    refused += 1
            honest = honest_infers(d, sample, TOKEN)
        row("sent", peak, 64 + 48, f"{refused} of 4 frames refused mid-send", honest)
    finally:
        for s in socks:
            s.close()
        d.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose bpuemu daemon is attacked")
    parser.add_argument("--bomb-mib", type=int, default=32)
    parser.add_argument("--announced", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_attacks_") as work:
        sample = Sample(work)
        print(f"{'attack':15s} {'rss MiB':>8s} {'peak':>8s} {'growth':>8s} {'limit':>8s}  {'honest':7s} outcome")
        external_data(args.python, work, sample)
        bombs(args.python, work, sample, args.bomb_mib)
        stalled(args.python, work, sample)
        data_channel(args.python, work, sample, args.announced)


if __name__ == "__main__":
    main()
