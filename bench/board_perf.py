#!/usr/bin/env python3
"""Board benchmarks, measured side by side in one run (this machine is shared and noisy).

    python bench/board_perf.py [--size 224] [--frames 300] [--rounds 5] [--paddle] [--runtime-only]

Prints four ratios, each with its goal (issue 2):

1. remote perf FPS / in-process perf FPS: perf frames run on the board, so the
   network is excluded (goal >= 0.97).
2. remote infer latency - local infer latency, for a 1x3x224x224 uint8 input,
   against a raw TCP loopback round trip of the same bytes (goal: within
   2 x TCP + 0.2 ms, issue 17); through the data channel (the default) and
   through gRPC alone, for comparison. Beside them, in the same rounds, the
   round trip of the same bytes over raw TCP to a server in another process
   that works the round's local frame time before it replies, less that time:
   the wire and the two wake-ups an infer has (the board's thread after the
   request, the client's after the reply), with no Python protocol code on
   either end; on a busy machine the wake-ups are most of it. The goal column
   says in how many rounds the difference was within the goal. After the
   table: how often the cores went idle per local frame and per remote infer
   (the cpuidle driver and, in a VM with haltpoll, guest_halt_poll_ns: how
   long an idle core polls before it halts), the CPU each kind of remote
   infer costs this process and the board together over a local frame's, and
   the data channel call stage by stage on the client (encode, send, wait,
   parse, and the board's own run of the frame).
3. perf FPS at thread_num=2 / thread_num=1 (goal >= 1.7 on 2 cores).
4. runtime FPS on the .bin / plain onnxruntime FPS on the equivalent quantized
   ONNX with the same session options (goal >= 0.95 with onnxruntime fed the
   ready int8 NCHW tensor, issue 17; for reference, with onnxruntime doing the
   runtime's uint8 NHWC -> int8 NCHW conversion in numpy first). onnxruntime
   runs through its binding, as the runtime's pieces do (its Python wrapper's
   feed checks would slow its side only). Beside it, the runtime as it ran
   before issue 17 (the input's layout change one Transpose, the plan's pieces
   run one by one). Measured in wall time and in this thread's CPU time (both
   sides run single-threaded in the calling thread, so CPU time is what each
   side costs, free of the noise of other processes on a shared machine); on
   the sample CNN and, with --paddle, on PaddleOCR's cls and PP-OCRv4 det
   converted by makertbin (bgr NHWC inputs, the models bench/convert.py and
   the tests use). After the table, per model, where a runtime frame goes: its
   onnxruntime runs, the Python around them (the frame less those runs), and
   the layout change's share of the runs by onnxruntime's profiler.
   --runtime-only runs this comparison alone (no daemon).
5. remote infer FPS / local infer FPS with two clients on two cores (goal
   >= 0.9): two threads each calling infer on the board (one channel each),
   against two threads each running the model in-process, in slices of 0.75 s
   alternating over at least 12 rounds. Beside it, the same calls' frames per
   CPU second (this process and the board's, against this process alone), and
   per CPU second of the board alone (what serving costs the board itself: on
   a real board the clients' work is done on other machines). On
   a quiet machine the two cores are the limit and the FPS ratio comes to the
   CPU one. On a shared machine it cannot be stable: with the kernel's
   autogroup scheduling on (kernel.sched_autogroup_enabled=1, as here), the
   two cores are shared fairly between sessions, not threads: this bench, its
   board and both sides' threads are one group, which gets 2/(K+1) cores
   against K other busy sessions, whatever it runs. So each side's FPS is the
   group's share in its slice, which moves from second to second with the
   others' jobs (two of them busy: one core for the bench, for either side).
   Short alternating slices put both sides under the same load; the CPU
   ratio is the figure that holds, and the wall ratio only on a quiet machine.

Every comparison alternates its two sides over --rounds rounds, so drift in
machine load hits both sides alike, and takes each round's ratio (or
difference) from the two sides measured next to each other: a row prints
the median over the rounds and, in brackets, their lowest and highest, so a
run shows how far to trust it. The header gives the load average the run saw
(the machine may be shared). The daemon runs in its own process on loopback.

Latest figures (bench/RESULTS.md has every run, with its date, commit and machine): data channel
infer over local 0.25-0.30 ms against the goal's 0.256 (met in 1-3 of 5 rounds); two clients 0.75-0.82
(goal 0.9, not met); ``--runtime-only --paddle --rounds 7``: runtime / onnxruntime in CPU time 0.985
(sample CNN), 0.961 (PP-OCR cls), 0.995 (PP-OCRv4 det 320).
"""
import argparse
import glob
import logging
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from typing import Optional

import numpy as np

from bpuemu.board.client import BoardClient
from bpuemu.board.runtime import PerfConfig, Runtime, run_perf
from bpuemu.board.runtime.sessions import session_options
from bpuemu.host.samples.daemon import start_daemon
from bpuemu.host.samples import sample_bin


def ratio_rows(label, local, before, ort_session, feed_name, x, ready, frames, rounds):
    """Rows for runtime FPS / onnxruntime FPS on one model (wall and CPU time; onnxruntime fed the int8 NCHW
    input ready, and doing the runtime's uint8 NHWC -> int8 NCHW conversion in numpy first), the same for
    ``before`` (the runtime as it ran the model before), and where a runtime frame's time goes.

    onnxruntime runs through its binding (``InferenceSession._sess.run``), as the runtime's pieces do: its
    Python wrapper's per-call feed checks would add some us to onnxruntime's side only."""
    def timed(fn):
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(frames):
            fn()
        return frames / (time.perf_counter() - w0), frames / max(time.thread_time() - c0, 1e-9)

    def convert():
        return np.ascontiguousarray((x ^ np.uint8(0x80)).view(np.int8).transpose(0, 3, 1, 2))

    run = ort_session._sess.run
    names = [o.name for o in ort_session.get_outputs()]
    sides = {"rt": lambda: local.run([x]), "before": lambda: before.run([x]),
             "ready": lambda: run(names, {feed_name: ready}, None),
             "conv": lambda: run(names, {feed_name: convert()}, None),
             "sessions": onnxruntime_part(local, x)}
    got = {k: ([], []) for k in sides}
    for fn in sides.values():
        fn()  # warm
    for _ in range(rounds):
        for k, fn in sides.items():
            wall, cpu = timed(fn)
            got[k][0].append(wall)
            got[k][1].append(cpu)
    rows = []
    for clock, i in (("CPU time", 1), ("wall", 0)):
        for mine, other, what, goal in (("rt", "ready", "int8 input ready", ">= 0.95"),
                                        ("rt", "conv", "same input conversion", "(for reference)"),
                                        ("before", "ready", "int8 input ready", "(before)")):
            name = (f"{label}: runtime FPS / onnxruntime FPS ({what}, {clock})" if mine == "rt" else
                    f"{label}:   same, one Transpose and the pieces one by one ({what}, {clock})")
            rows.append(ratio_row(name, got[mine][i], got[other][i], goal, lambda r: r >= 0.95))
    us = {k: [1e6 / v for v in got[k][1]] for k in ("rt", "ready", "sessions")}
    extra = [a - b for a, b in zip(us["rt"], us["ready"])]
    python = [a - b for a, b in zip(us["rt"], us["sessions"])]
    layout, nodes = layout_us(local, x, max(20, frames // 2))
    split = (f"{label}: CPU us per frame (medians of rounds): onnxruntime {statistics.median(us['ready']):.0f}, "
             f"runtime {statistics.median(us['rt']):.0f}: {statistics.median(extra):.0f} more [{min(extra):.0f} to {max(extra):.0f}], "
             f"of which Python around its onnxruntime runs {statistics.median(python):.0f} [{min(python):.0f} to {max(python):.0f}]; "
             f"in those runs the input's layout change takes {layout:.0f} of {nodes:.0f} us of node time "
             f"(onnxruntime's profiler: wall, its own cost per node included)")
    return rows, split


def onnxruntime_part(local, x):
    """What a runtime frame spends in onnxruntime: its frame's onnxruntime steps, on tensors made once."""
    from bpuemu.board.runtime.model import MergedStep, OrtStep

    tensors = local._feed([x])
    for step in local._frame_steps:
        step.run(tensors)
    runs = [s for s in local._frame_steps if isinstance(s, (OrtStep, MergedStep))]

    def fn():
        for step in runs:
            step.run(tensors)
    return fn


def layout_us(local, x, frames):
    """(us per frame of the input's layout-change nodes, us per frame of all nodes: each node's median over
    ``frames`` runs) in the runtime's first onnxruntime session, by onnxruntime's profiler (a profiled copy of
    that session)."""
    import json

    import onnxruntime as ort

    from bpuemu.board.runtime.merge import merge_pieces
    from bpuemu.board.runtime.model import MergedStep, OrtStep
    from bpuemu.host.compiler.fuse_preprocess import LAYOUT_SUFFIX

    step = next(s for s in local._frame_steps if isinstance(s, (OrtStep, MergedStep)))
    blob = merge_pieces([p.blob for p in step.steps], step.outputs) if isinstance(step, MergedStep) else step.blob
    opts = session_options()
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="bpuemu-bench-prof-"), "p")
    sess = ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])
    feed = {step.inputs[0]: x} if len(step.inputs) == 1 else None
    if feed is None:
        return float("nan"), float("nan")
    for _ in range(frames):
        sess.run(step.outputs, feed)
    path = sess.end_profiling()
    with open(path) as f:
        events = [e for e in json.load(f) if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    by_node = {}
    for e in events:
        by_node.setdefault(e["name"], []).append(e["dur"])
    us = {name: statistics.median(durations) for name, durations in by_node.items()}  # the first run's set-up out
    return sum(v for k, v in us.items() if LAYOUT_SUFFIX in k), sum(us.values())


def spread(values) -> str:
    """The lowest and highest of a row's per-round values."""
    return f"[{min(values):.3f}-{max(values):.3f}]"


def ratio_row(name, mine, other, goal, ok):
    """A row from per-round figures of two sides measured next to each other: the median of the
    rounds' ratios (the raw figures are the sides' medians)."""
    ratios = [a / b for a, b in zip(mine, other)]
    r = statistics.median(ratios)
    return (name, f"{statistics.median(mine):.1f} / {statistics.median(other):.1f}", r, spread(ratios), goal, ok(r))


def before_model(bin_path, quantized_path):
    """The same model as the runtime ran it before (issue 17): the input's layout change one Transpose in
    the subgraph, the pieces run one by one. The placement is the .bin's own (its steps' source nodes)."""
    import onnx

    from bpuemu.board.runtime.model import LoadedModel
    from bpuemu.common.container import read_bin
    from bpuemu.host.compiler import fuse_preprocess
    from bpuemu.host.compiler.partition import compile_model

    model = read_bin(bin_path).model()
    kind = model.plan[0].__class__
    bpu = [n for s in model.plan if s.kind == kind.BPU_SUBGRAPH for n in s.source_nodes]
    cpu = [n for s in model.plan if s.kind == kind.CPU_OP for n in s.source_nodes]
    rows, fuse_preprocess._ROW_PIXELS = fuse_preprocess._ROW_PIXELS, ()
    try:
        cm = compile_model(onnx.load(quantized_path), model.name, list(model.input_specs), force_cpu=cpu,
                           force_bpu=bpu)
    finally:
        fuse_preprocess._ROW_PIXELS = rows
    return LoadedModel(cm.model, cm.blobs, merge=False)


def paddle_case(name, work, det_size):
    """PaddleOCR cls or det converted by makertbin (bgr, NHWC at run time): (.bin, quantized ONNX, x, ready)."""
    import yaml

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import convert as bench_convert
    from bpuemu.host.mapper.makertbin import makertbin_from_config

    h, w = (48, 192) if name == "cls" else (det_size, det_size)
    float_path = bench_convert.paddle_models()[name]
    cal = os.path.join(work, f"{name}_cal")
    os.makedirs(cal, exist_ok=True)
    for i, page in enumerate(bench_convert.pages(h, w, 4, 7)):
        np.ascontiguousarray(page[..., ::-1].transpose(2, 0, 1)[None]).tofile(os.path.join(cal, f"{i:04d}.bgr"))
    doc = {
        "model_parameters": {"onnx_model": float_path, "march": "bayes-e", "output_model_file_prefix": name,
                             "working_dir": os.path.join(work, f"{name}_out")},
        "input_parameters": {"input_name": "x", "input_type_train": "bgr", "input_layout_train": "NCHW",
                             "input_type_rt": "bgr", "input_layout_rt": "NHWC", "norm_type": "data_mean_and_scale",
                             "mean_value": "127.5 127.5 127.5", "scale_value": "0.007843137",
                             "input_shape": f"1x3x{h}x{w}"},
        "calibration_parameters": {"cal_data_dir": cal, "cal_data_type": "uint8", "calibration_type": "max"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3"},
    }
    path = os.path.join(work, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f)
    art = makertbin_from_config(path)
    x = np.ascontiguousarray(bench_convert.pages(h, w, 1, 99)[0][..., ::-1][None])
    ready = np.ascontiguousarray((x ^ np.uint8(0x80)).view(np.int8).transpose(0, 3, 1, 2))
    return art.bin, art.quantized, x, ready


def cpu_seconds(pid=None) -> float:
    """CPU time (user + system) used so far by this process, or by process ``pid`` (Linux /proc)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def two_client_fps(calls, seconds, board_pid=None):
    """(frames per second, frames per CPU second, frames per board CPU second) of two threads each calling its
    function of ``calls`` as fast as it can. The CPU is this process's, plus the board's (process ``board_pid``)
    when the calls go there: what the frames cost wherever they ran, which other processes on a shared machine
    do not change; the last figure counts the board's alone (None without a board)."""
    stop = time.monotonic() + seconds
    counts = [0, 0]

    def loop(i, fn):
        while time.monotonic() < stop:
            fn()
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i, fn)) for i, fn in enumerate(calls)]
    t0 = time.perf_counter()
    c0, b0 = cpu_seconds(), (cpu_seconds(board_pid) if board_pid else 0.0)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    board = (cpu_seconds(board_pid) if board_pid else 0.0) - b0
    cpu = cpu_seconds() - c0 + board
    frames = sum(counts)
    return frames / (time.perf_counter() - t0), frames / max(cpu, 1e-9), frames / max(board, 1e-9) if board_pid else None


def median_of(rounds, fn):
    return statistics.median(fn() for _ in range(rounds))


def latency_stages(board, sha, x, calls) -> dict:
    """Median microseconds of each stage of an infer through the data channel, timed on the client
    (the steps of BoardClient's data channel call, one by one): encode the request, send it, wait for
    the reply, parse it; and the board's own run of the frame (the reply's latency)."""
    board.infer(sha, "", [x])
    channel = board._data  # the connection BoardClient.infer uses
    times = {k: [] for k in ("encode", "send", "wait", "parse", "run")}
    cpus = os.sched_getaffinity(0) if channel.keep_cpu else None  # kept on its CPU meanwhile, as BoardClient does
    for _ in range(calls):
        deadline = time.monotonic() + 60
        t0 = time.perf_counter()
        parts = channel.requests.parts(sha, "", [x])
        t1 = time.perf_counter()
        if cpus:
            os.sched_setaffinity(0, (channel._getcpu(),))
        channel.writer.send(parts, deadline)
        t2 = time.perf_counter()
        kind, payload = channel.reader.frame(deadline)
        t3 = time.perf_counter()
        if cpus:
            os.sched_setaffinity(0, cpus)
        result = channel.replies.parse(payload, copy=len(payload) <= channel.reader.keep_bytes)  # as _DataChannel
        t4 = time.perf_counter()
        for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, result.latency_ms[0] / 1e3)):
            times[k].append(v * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def _busy_server(port_file, reply):
    """Serve requests of (8-byte size, 8-byte microseconds of work, payload): read the payload, work that
    long on this core, reply ``reply`` bytes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(srv.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(1 << 20)
    while True:
        head = conn.recv(16, socket.MSG_WAITALL)
        if len(head) < 16:
            return
        size, work_us = int.from_bytes(head[:8], "little"), int.from_bytes(head[8:], "little")
        got = 0
        while got < size:
            got += conn.recv_into(buf)
        end = time.perf_counter() + work_us / 1e6
        while time.perf_counter() < end:  # a frame's work: the server's thread stays on its core
            pass
        conn.sendall(b"r" * reply)


class BusyServer:
    """A loopback TCP server in another process that works a given time before it replies: an infer's wire
    and its two wake-ups (the server's after the request, the client's after the reply) without Python's
    protocol code on either end."""

    def __init__(self, reply: int = 4096):
        import multiprocessing

        self.reply = reply
        self._port_file = os.path.join(tempfile.mkdtemp(prefix="bpuemu-bench-tcp-"), "port")
        self._proc = multiprocessing.get_context("spawn").Process(target=_busy_server, args=(self._port_file, reply),
                                                                  daemon=True)
        self._proc.start()
        deadline = time.monotonic() + 60
        while not os.path.exists(self._port_file):
            if time.monotonic() > deadline or not self._proc.is_alive():
                raise RuntimeError("the TCP reference server did not start")
            time.sleep(0.01)
        with open(self._port_file) as f:
            self.sock = socket.create_connection(("127.0.0.1", int(f.read())))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray(65536)

    def block_ms(self, nbytes: int, work_ms: float, repeats: int) -> list:
        """Round trips of ``nbytes`` to the server working ``work_ms``, less ``work_ms`` (ms each)."""
        payload = nbytes.to_bytes(8, "little") + int(work_ms * 1e3).to_bytes(8, "little") + bytes(nbytes)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self.sock.sendall(payload)
            got = 0
            while got < self.reply:
                got += self.sock.recv_into(self._buf)
            times.append((time.perf_counter() - t0) * 1e3 - work_ms)
        return times

    def close(self) -> None:
        self.sock.close()
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
        shutil.rmtree(os.path.dirname(self._port_file), ignore_errors=True)


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


def idle_entries() -> Optional[int]:
    """Times this machine's cores have entered an idle state so far (Linux cpuidle), or None where not shown."""
    total, found = 0, False
    for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpuidle/state[0-9]*/usage"):
        try:
            with open(path) as f:
                total += int(f.read())
            found = True
        except (OSError, ValueError):
            pass
    return total if found else None


def _read_setting(path: str) -> Optional[str]:
    """A kernel setting's text (/proc/sys, /sys), or None where this machine does not show it."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpuidle_line() -> str:
    """How this machine's cores idle: the cpuidle driver and, under a hypervisor's haltpoll, how long an idle
    core polls before it halts (0: it halts at once, and waking it is a trip through the hypervisor)."""
    driver = _read_setting("/sys/devices/system/cpu/cpuidle/current_driver")
    poll_ns = _read_setting("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
    return f"cpuidle driver {driver or 'none shown'}" + (f", guest_halt_poll_ns={poll_ns}" if poll_ns else "")


def autogroup_on() -> bool:
    """Whether the kernel shares the cores between sessions rather than threads (Linux autogroup scheduling).
    bench/ocr_farm.py asks too."""
    return _read_setting("/proc/sys/kernel/sched_autogroup_enabled") == "1"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, for a bench's header (bench/ocr_farm.py prints them too)."""
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def runtime_rows(args, work, model, qonnx, local, x):
    """4: runtime vs plain onnxruntime on the equivalent quantized ONNX, same options: (rows, split lines)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(qonnx, session_options(), providers=["CPUExecutionProvider"])
    ready = np.ascontiguousarray((x ^ np.uint8(0x80)).view(np.int8).transpose(0, 3, 1, 2))
    rows, split = ratio_rows(f"sample CNN {args.size}", local, before_model(model, qonnx), sess, "data", x, ready,
                             args.frames, args.rounds)
    splits = [split]
    if args.paddle:
        for name in ("cls", "det"):
            bin_path, q_path, px, pready = paddle_case(name, work, args.det_size)
            prt = Runtime()
            prt.load(bin_path)
            psess = ort.InferenceSession(q_path, session_options(), providers=["CPUExecutionProvider"])
            pmodel = prt.model()
            assert all(np.array_equal(a, b) for a, b in zip(pmodel.run([px]), psess.run(None, {"x": pready})))
            frames = max(20, args.frames // (1 if name == "cls" else 10))
            more, split = ratio_rows(f"PP-OCR {name} {'x'.join(map(str, px.shape[1:3]))}", pmodel,
                                     before_model(bin_path, q_path), psess, "x", px, pready, frames, args.rounds)
            rows += more
            splits.append(split)
    return rows, splits


def print_rows(rows):
    width = max(len(row[0]) for row in rows)
    for name, raw, ratio, spread_, goal, ok in rows:
        shown = goal if goal.startswith("(") else f"goal {goal:<28} {'met' if ok else 'NOT met'}"
        print(f"{name:<{width}}  {raw:>22}  = {ratio:7.3f} {spread_:>15}   {shown}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--paddle", action="store_true", help="also PaddleOCR cls and det (converted here; slower)")
    ap.add_argument("--det-size", type=int, default=320, help="PP-OCRv4 det input height and width (--paddle)")
    ap.add_argument("--runtime-only", action="store_true", help="only 4, runtime vs onnxruntime (no daemon)")
    args = ap.parse_args()
    logging.getLogger().setLevel(logging.ERROR)
    work = tempfile.mkdtemp(prefix="bpuemu-bench-")
    try:
        measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args, work: str) -> None:
    """Every section of the bench, its models, daemons' stores and logs under ``work``."""
    load_start = load_average()
    model = os.path.join(work, "m.bin")
    qonnx = os.path.join(work, "m_quantized_model.onnx")
    sample_bin(model, "rgb", "NHWC", args.size, args.size, quantized_path=qonnx)
    rt = Runtime()
    rt.load(model)
    local = rt.model()
    x = np.random.default_rng(0).integers(0, 256, (1, args.size, args.size, 3), dtype=np.uint8)
    if args.runtime_only:
        rows, splits = runtime_rows(args, work, model, qonnx, local, x)
        load = load_average()
        print(f"runtime vs onnxruntime, {args.frames} frames x {args.rounds} rounds, {os.cpu_count()} cores, "
              f"load average {load_start} at the start, {load} at the end")
        print_rows(rows)
        print("\n".join(splits))
        return

    daemon, target = start_daemon(os.path.join(work, "store"), os.path.join(work, "hrt_boardd.log"))
    apart_daemon, apart_target = start_daemon(os.path.join(work, "store-apart"), os.path.join(work, "apart.log"),
                                              extra_args=["--no-follow-client-cpu"])
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

            # 2: infer latency, remote (data channel, and gRPC only) vs local. Blocks of
            # calls alternate: alternating single calls would make each side evict the
            # other's caches and slow both. Each side's CPU (this process's, and the board's
            # for a remote call) is summed over its blocks.
            grpc_only = BoardClient(target, data_channel=False)
            apart = BoardClient(apart_target, keep_cpu=False)  # each end on whichever CPU the kernel picks
            apart.ensure_model(model)
            apart.load(sha)
            apart.infer(sha, "", [x])
            sides = {"local": (lambda: local.run([x]), None), "data": (lambda: board.infer(sha, "", [x]), daemon.pid),
                     "apart": (lambda: apart.infer(sha, "", [x]), apart_daemon.pid),
                     "grpc": (lambda: grpc_only.infer(sha, "", [x]), daemon.pid)}
            lat = {k: [] for k in sides}  # every call's ms
            med = {k: [] for k in sides}  # each round's median
            cpu = dict.fromkeys(sides, 0.0)
            idle = dict.fromkeys(sides, 0)  # times a core went idle during the side's blocks

            def block_ms(side, n=200):
                fn, pid = sides[side]
                times = []
                c0, i0 = time.process_time() + (cpu_seconds(pid) if pid else 0.0), idle_entries()
                for _ in range(n):
                    t0 = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t0) * 1e3)
                cpu[side] += time.process_time() + (cpu_seconds(pid) if pid else 0.0) - c0
                if i0 is not None:
                    idle[side] += idle_entries() - i0
                lat[side] += times
                med[side].append(statistics.median(times))

            busy = BusyServer()
            tl = []
            for _ in range(max(5, args.rounds)):
                for side in sides:
                    block_ms(side)
                tl.append(statistics.median(busy.block_ms(x.nbytes, med["local"][-1], 200)))
            busy.close()
            grpc_only.close()
            apart.close()
            over = {k: [a - b for a, b in zip(med[k], med["local"])] for k in sides}  # each round's difference
            cpu_over = {k: (cpu[k] - cpu["local"]) / len(lat[k]) * 1e3 for k in sides}  # ms of CPU per call over local

            stages = latency_stages(board, sha, x, 50 * max(5, args.rounds))

            # 5: two clients on two cores, remote infer vs in-process, alternating in short slices so
            # that other processes' load, which moves from second to second, falls on both sides alike.
            remote_clients = [BoardClient(target) for _ in range(2)]
            remote_calls = [lambda c=c: c.infer(sha, "", [x]) for c in remote_clients]
            for call in remote_calls:  # connected and warm before the first slice
                call()
            two_l, two_r, cpu_l, cpu_r, board_r = [], [], [], [], []
            for _ in range(max(12, 2 * args.rounds)):
                for fps, per_cpu, calls, pid in ((two_l, cpu_l, [lambda: local.run([x])] * 2, None),
                                                 (two_r, cpu_r, remote_calls, daemon.pid)):
                    a, b, c = two_client_fps(calls, 0.75, pid)
                    fps.append(a)
                    per_cpu.append(b)
                    if c is not None:
                        board_r.append(c)
            for c in remote_clients:
                c.close()
            out_bytes = sum(p.aligned_byte_size for p in local.output_properties)
            tcp = tcp_round_trip_ms(x.tobytes(), out_bytes, len(lat["local"]))
    finally:
        for d in (daemon, apart_daemon):
            d.terminate()
            d.wait(timeout=30)

    rt_rows, splits = runtime_rows(args, work, model, qonnx, local, x)

    allowed = 2 * tcp + 0.2
    at_least = lambda goal: lambda r: r >= goal  # noqa: E731
    within = lambda r: r <= allowed  # noqa: E731
    latency_goal = f"<= 2*TCP({tcp:.3f})+0.2 = {allowed:.3f}"

    def latency_row(name, side, goal=True):
        d = over[side]
        raw = f"{statistics.median(lat[side]):.3f} - {statistics.median(lat['local']):.3f}"
        shown = f"{latency_goal} ({sum(v <= allowed for v in d)}/{len(d)} rounds)" if goal else \
            "(each end on whichever CPU the kernel picks: before)"
        return name, raw, statistics.median(d), spread(d), shown, within(statistics.median(d))

    rows = [
        ratio_row("remote perf FPS / local perf FPS (1 thread)", r["r1"], r["l1"], ">= 0.97", at_least(0.97)),
        ratio_row("remote perf FPS / local perf FPS (2 threads)", r["r2"], r["l2"], ">= 0.97", at_least(0.97)),
        latency_row("remote - local infer latency (ms), data channel", "data"),
        latency_row("  same, keep_cpu=False, --no-follow-client-cpu", "apart", goal=False),
        latency_row("remote - local infer latency (ms), gRPC only", "grpc"),
        ("  TCP to a server busy a frame's time, less the frame (ms)", "", statistics.median(tl), spread(tl),
         "(the wire and its two wake-ups)", True),
        ratio_row("perf FPS thread_num=2 / thread_num=1 (local)", r["l2"], r["l1"], ">= 1.7", at_least(1.7)),
        ratio_row("perf FPS thread_num=2 / thread_num=1 (board)", r["r2"], r["r1"], ">= 1.7", at_least(1.7)),
        ratio_row("remote / local infer FPS, two clients on two cores", two_r, two_l, ">= 0.9", at_least(0.9)),
        ratio_row("  same, frames per CPU second (client + board / in-process)", cpu_r, cpu_l, "(load-free)",
                  at_least(0.9)),
        ratio_row("  same, frames per board CPU second / in-process", board_r, cpu_l,
                  "(the board's own cost)", at_least(0.9)),
    ] + rt_rows
    load = load_average()
    print(f"model: sample CNN 1x3x{args.size}x{args.size} rgb, {args.frames} frames x {args.rounds} rounds, "
          f"input {x.nbytes} bytes, {os.cpu_count()} cores, load average {load_start} at the start, {load} at the end")
    print("each row: the sides' medians = the median of the rounds' ratios (differences) [lowest-highest round]")
    if autogroup_on():
        print("kernel.sched_autogroup_enabled=1: this bench and its board share one session's part of the cores "
              "against the machine's other busy sessions (see the docstring, 5)")
    print_rows(rows)
    print("\n".join(splits))
    if idle_entries() is not None:
        print(f"{cpuidle_line()}; the cores went idle {idle['local'] / len(lat['local']):.2f} times per local "
              f"frame, {idle['data'] / len(lat['data']):.2f} per data channel infer and "
              f"{idle['apart'] / len(lat['apart']):.2f} with each end on any CPU (about 2 on an idle machine: each "
              "end's core idles while the other works, and must be woken)")
    print("CPU per remote infer (this process and the board) over a local frame's (ms): "
          + ", ".join(f"{name} {cpu_over[k]:.3f}" for k, name in (("data", "data channel"),
                                                                 ("apart", "each end on any CPU"), ("grpc", "gRPC only"))))
    print("remote infer through the data channel, stage by stage on the client (median us): "
          + ", ".join(f"{k} {v:.0f}" for k, v in stages.items())
          + f"; wait - run = {stages['wait'] - stages['run']:.0f} (the wire both ways and the board's own work)")


if __name__ == "__main__":
    main()
