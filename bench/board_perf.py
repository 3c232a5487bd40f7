#!/usr/bin/env python3
"""Board benchmarks, measured side by side in one run (this machine is shared and noisy).

    python bench/board_perf.py [--size 224] [--frames 300] [--rounds 5]

Prints four ratios, each with its goal (issue 2):

1. remote perf FPS / in-process perf FPS: perf frames run on the board, so the
   network is excluded (goal >= 0.97).
2. remote infer latency - local infer latency, for a 1x3x224x224 uint8 input,
   against a raw TCP loopback round trip of the same bytes (goal: within
   1.5 x TCP + 0.5 ms); through the data channel (the default) and through
   gRPC alone, for comparison.
3. perf FPS at thread_num=2 / thread_num=1 (goal >= 1.7 on 2 cores).
4. runtime FPS on the .bin / plain onnxruntime FPS on the equivalent quantized
   ONNX with the same session options (goal >= 0.9); once with onnxruntime fed
   the ready int8 NCHW tensor, once with it doing the same uint8 NHWC -> int8
   NCHW conversion the runtime's Preprocess does.

Every comparison alternates its two sides over --rounds rounds and reports
medians, so drift in machine load hits both sides alike. The daemon runs in
its own process on loopback.
"""
import argparse
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from bpuemu.board.client import BoardClient
from bpuemu.board.runtime import PerfConfig, Runtime, run_perf
from bpuemu.board.runtime.sessions import session_options
from bpuemu.host.samples.daemon import start_daemon
from bpuemu.host.samples import sample_bin


def median_of(rounds, fn):
    return statistics.median(fn() for _ in range(rounds))


def tcp_round_trip_ms(payload: bytes, reply: int, repeats: int) -> float:
    """Median time to send ``payload`` over loopback TCP and get ``reply`` bytes back."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve():
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            for _ in range(repeats):
                got = 0
                while got < len(payload):
                    got += len(conn.recv(1 << 20))
                conn.sendall(b"r" * reply)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    cli = socket.create_connection(("127.0.0.1", port))
    cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        cli.sendall(payload)
        got = 0
        while got < reply:
            got += len(cli.recv(65536))
        times.append((time.perf_counter() - t0) * 1e3)
    cli.close()
    srv.close()
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)

    work = tempfile.mkdtemp(prefix="bpuemu-bench-")
    model = os.path.join(work, "m.bin")
    qonnx = os.path.join(work, "m_quantized_model.onnx")
    sample_bin(model, "rgb", "NHWC", args.size, args.size, quantized_path=qonnx)
    rt = Runtime()
    rt.load(model)
    local = rt.model()
    x = np.random.default_rng(0).integers(0, 256, (1, args.size, args.size, 3), dtype=np.uint8)

    daemon, target = start_daemon(os.path.join(work, "store"), os.path.join(work, "hrt_boardd.log"))
    try:
        with BoardClient(target) as board:
            sha = board.ensure_model(model)
            board.load(sha)
            board.infer(sha, "", [x])  # warm
            run_perf(local, [x], PerfConfig(frame_count=50))

            def fps_local(threads):
                return run_perf(local, [x], PerfConfig(frame_count=args.frames, thread_num=threads)).fps

            def fps_remote(threads):
                return board.perf(sha, "", PerfConfig(frame_count=args.frames, thread_num=threads), [x]).fps

            # 1 + 3: perf FPS, remote vs local, 1 and 2 threads, interleaved.
            r = {k: [] for k in ("l1", "r1", "l2", "r2")}
            for _ in range(args.rounds):
                r["l1"].append(fps_local(1))
                r["r1"].append(fps_remote(1))
                r["l2"].append(fps_local(2))
                r["r2"].append(fps_remote(2))
            m = {k: statistics.median(v) for k, v in r.items()}

            # 2: infer latency, remote (data channel, and gRPC only) vs local. Blocks of
            # calls alternate: alternating single calls would make each side evict the
            # other's caches and slow both.
            grpc_only = BoardClient(target, data_channel=False)

            def block_ms(fn, n=50):
                times = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t0) * 1e3)
                return times

            ll, rl, gl = [], [], []
            for _ in range(4 * args.rounds):
                ll += block_ms(lambda: local.run([x]))
                rl += block_ms(lambda: board.infer(sha, "", [x]))
                gl += block_ms(lambda: grpc_only.infer(sha, "", [x]))
            grpc_only.close()
            lat_l, lat_r, lat_g = statistics.median(ll), statistics.median(rl), statistics.median(gl)
            out_bytes = sum(p.aligned_byte_size for p in local.output_properties)
            tcp = tcp_round_trip_ms(x.tobytes(), out_bytes, len(ll))
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)

    # 4: runtime vs plain onnxruntime on the equivalent quantized ONNX, same options.
    import onnxruntime as ort

    sess = ort.InferenceSession(qonnx, session_options(), providers=["CPUExecutionProvider"])
    ready = np.ascontiguousarray((x ^ np.uint8(0x80)).view(np.int8).transpose(0, 3, 1, 2))

    def ort_fps(convert):
        t0 = time.perf_counter()
        for _ in range(args.frames):
            feed = np.ascontiguousarray((x ^ np.uint8(0x80)).view(np.int8).transpose(0, 3, 1, 2)) if convert else ready
            sess.run(None, {"data": feed})
        return args.frames / (time.perf_counter() - t0)

    def rt_fps():
        t0 = time.perf_counter()
        for _ in range(args.frames):
            local.run([x])
        return args.frames / (time.perf_counter() - t0)

    o_ready, o_conv, rts = [], [], []
    for _ in range(args.rounds):
        rts.append(rt_fps())
        o_ready.append(ort_fps(False))
        o_conv.append(ort_fps(True))
    rt_m, o_ready_m, o_conv_m = (statistics.median(v) for v in (rts, o_ready, o_conv))

    allowed = 1.5 * tcp + 0.5
    rows = [
        ("remote perf FPS / local perf FPS (1 thread)", f"{m['r1']:.1f} / {m['l1']:.1f}", m["r1"] / m["l1"], ">= 0.97", m["r1"] / m["l1"] >= 0.97),
        ("remote perf FPS / local perf FPS (2 threads)", f"{m['r2']:.1f} / {m['l2']:.1f}", m["r2"] / m["l2"], ">= 0.97", m["r2"] / m["l2"] >= 0.97),
        ("remote - local infer latency (ms), data channel", f"{lat_r:.3f} - {lat_l:.3f}", lat_r - lat_l, f"<= 1.5*TCP({tcp:.3f})+0.5 = {allowed:.3f}", lat_r - lat_l <= allowed),
        ("remote - local infer latency (ms), gRPC only", f"{lat_g:.3f} - {lat_l:.3f}", lat_g - lat_l, f"<= 1.5*TCP({tcp:.3f})+0.5 = {allowed:.3f}", lat_g - lat_l <= allowed),
        ("perf FPS thread_num=2 / thread_num=1 (local)", f"{m['l2']:.1f} / {m['l1']:.1f}", m["l2"] / m["l1"], ">= 1.7", m["l2"] / m["l1"] >= 1.7),
        ("perf FPS thread_num=2 / thread_num=1 (board)", f"{m['r2']:.1f} / {m['r1']:.1f}", m["r2"] / m["r1"], ">= 1.7", m["r2"] / m["r1"] >= 1.7),
        ("runtime FPS / onnxruntime FPS (int8 input ready)", f"{rt_m:.1f} / {o_ready_m:.1f}", rt_m / o_ready_m, ">= 0.9", rt_m / o_ready_m >= 0.9),
        ("runtime FPS / onnxruntime FPS (same input conversion)", f"{rt_m:.1f} / {o_conv_m:.1f}", rt_m / o_conv_m, ">= 0.9", rt_m / o_conv_m >= 0.9),
    ]
    print(f"model: sample CNN 1x3x{args.size}x{args.size} rgb, {args.frames} frames x {args.rounds} rounds (medians), "
          f"input {x.nbytes} bytes, {os.cpu_count()} cores")
    width = max(len(r[0]) for r in rows)
    for name, raw, ratio, goal, ok in rows:
        print(f"{name:<{width}}  {raw:>22}  = {ratio:8.3f}   goal {goal:<28} {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
