#!/usr/bin/env python3
"""Soak run of one board daemon: mixed clients and injected faults for N minutes.

    python bench/soak.py --minutes 60 [--interval 60] [--daemon-log FILE] [--workers infer_data,upload,...]

Starts its own hrt_boardd on loopback (127.0.0.1, a free port) and runs these
clients against it at once, each in a thread with a BoardClient of its own, until
the time is up:

- infer_data : infer over the data channel (outputs checked against the first reply)
- infer_grpc : infer over gRPC Infer (same check)
- upload     : uploads of a known model (the board has it: costs nothing) and of
               new models (a fresh SHA-256 each time), each new one loaded, run
               once and unloaded
- upload_shared: every few seconds a new model uploaded by --shared-uploaders
               clients at once (they share one upload slot: one stores it, the
               others wait and answer "already present"), then loaded and run
- perf       : perf jobs of --perf-frames frames
- perf_cancel: perf jobs cancelled by the caller after 0.2-0.8 s (Cancelled is expected)
- health     : grpc.health.v1 Check and GetStats
- metrics    : a scrape of the daemon's Prometheus endpoint (--metrics-listen) every
               few seconds; its call and frame counters must never go down
- faults     : every --fault-every seconds a client process (this script in
               --fault-client mode) starts a long call (a data channel or gRPC
               infer, a perf job, or an upload that stalls half way) and is
               SIGKILLed mid-call, after it said it is calling

Every --interval seconds it prints one line: calls made, unexpected and
expected errors, clients killed, p50/p99 latency of infer_data, infer_grpc and
of all calls, and the daemon's RSS (and its anonymous part, the heaps), open file descriptors and threads (from
/proc/<pid>). At the end: calls and errors by kind (with the first message of
each), and the goals:

- 0 unexpected errors (anything but perf_cancel's Cancelled), and no
  traceback in the daemon's log;
- RSS growth after warm-up (the first interval) below --rss-bound-mb, and, on
  runs of at least --slope-min-minutes after warm-up, an RSS slope (least squares
  over the intervals after warm-up) of at most --max-slope-mb-per-hour; the
  report also says what that slope would reach in a week;
- open fds and threads flat: the last interval's counts at most --fd-slack and
  --thread-slack above the warm-up's;
- afterwards: every job slot free again, no partial upload in the store, the
  daemon SERVING, and a clean exit on SIGTERM.

Latest figure (bench/RESULTS.md has the run's table): 60 minutes, RSS slope +1.57 MB/hour against a
baseline daemon's +3.40, 0 unexpected errors, fds and threads flat.

Exit status 1 when a goal is missed. Loopback only; every loop is bounded by
the run time, every call by its deadline; the daemon and all fault clients are
stopped at the end.
"""
import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List

import numpy as np

#: Kinds of long calls a fault client makes before it is killed.
FAULT_KINDS = ("infer_data", "infer_grpc", "perf", "upload")
#: The client workers, in the order they start.
WORKERS = ("infer_data", "infer_grpc", "upload", "perf", "perf_cancel", "upload_shared", "health", "metrics", "faults")
#: Error kinds that are part of the plan, not failures.
EXPECTED = {("perf_cancel", "Cancelled")}


# --- the daemon ----------------------------------------------------------------------------

def process_figures(pid: int) -> Dict[str, float]:
    """RSS (MB), open fds and threads of a process, from /proc."""
    figures = {"fds": len(os.listdir(f"/proc/{pid}/fd"))}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                figures["rss_mb"] = int(line.split()[1]) / 1024
            elif line.startswith("RssAnon:"):  # the heaps (a leak shows here), not the libraries' pages
                figures["anon_mb"] = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                figures["threads"] = int(line.split()[1])
    return figures


def free_port() -> int:
    """A loopback port free now (for the daemon's --metrics-listen)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_slope(samples: List[Dict[str, float]], interval_s: float, key: str = "rss_mb") -> float:
    """MB per hour: the least-squares slope of RSS (or ``key``) over the samples after warm-up (the first)."""
    after = samples[1:]
    if len(after) < 2:
        return 0.0
    hours = np.arange(len(after)) * interval_s / 3600
    return float(np.polyfit(hours, [s.get(key, 0.0) for s in after], 1)[0])


# --- what the clients record ---------------------------------------------------------------

class Tally:
    """Calls, latencies and errors of the current interval, and of the whole run (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.calls = collections.Counter()        # whole run, by kind
        self.errors = collections.Counter()       # whole run, by (kind, error class)
        self.first_message: Dict[tuple, str] = {}
        self.kills = 0
        self._interval = self._fresh()

    @staticmethod
    def _fresh() -> dict:
        return {"calls": 0, "unexpected": 0, "expected": 0, "kills": 0, "lat": collections.defaultdict(list)}

    def ok(self, kind: str, seconds: float) -> None:
        with self._lock:
            self.calls[kind] += 1
            self._interval["calls"] += 1
            self._interval["lat"][kind].append(seconds * 1e3)

    def error(self, kind: str, error: str, message: str) -> None:
        key = (kind, error)
        with self._lock:
            self.calls[kind] += 1
            self.errors[key] += 1
            self.first_message.setdefault(key, message.splitlines()[0] if message else "")
            self._interval["calls"] += 1
            self._interval["expected" if key in EXPECTED else "unexpected"] += 1

    def killed(self) -> None:
        with self._lock:
            self.kills += 1
            self._interval["kills"] += 1

    def take_interval(self) -> dict:
        with self._lock:
            out, self._interval = self._interval, self._fresh()
        return out

    @property
    def unexpected(self) -> int:
        return sum(n for key, n in self.errors.items() if key not in EXPECTED)


def timed(tally: Tally, kind: str, call: Callable[[], None]) -> None:
    """Run one call and record it; a BpuEmuError is an error of its class, anything else a bug."""
    from bpuemu.common.errors import BpuEmuError

    t0 = time.perf_counter()
    try:
        call()
    except BpuEmuError as exc:
        tally.error(kind, type(exc).__name__, str(exc))
    except Exception as exc:  # a client-side bug or a wrong answer: recorded, and the run goes on
        tally.error(kind, type(exc).__name__, f"{type(exc).__name__}: {exc}")
    else:
        tally.ok(kind, time.perf_counter() - t0)


# --- the clients ---------------------------------------------------------------------------

class Soak:
    def __init__(self, args, workdir: str, target: str, model_path: str):
        from bpuemu.common.container import read_bin
        from bpuemu.common.input_types import random_rt_input

        self.args, self.workdir, self.target, self.model_path = args, workdir, target, model_path
        self.tally = Tally()
        self.stop = threading.Event()
        self.base = read_bin(model_path)
        self.x = random_rt_input(self.base.model().input_specs[0], np.random.default_rng(0))
        self._new_models = 0
        self._lock = threading.Lock()
        self.rng = random.Random(args.seed)
        self.children: List[subprocess.Popen] = []
        self.metrics_target = ""  # HOST:PORT of the daemon's /metrics

    def client(self, **kw):
        from bpuemu.board.client import BoardClient

        return BoardClient(self.target, client_name="bench-soak", **kw)

    def new_model(self) -> str:
        """A model the board has not seen: the sample under a new name (a new SHA-256)."""
        from bpuemu.common.container import write_bin
        from bpuemu.common.proto import model_pb2

        with self._lock:
            self._new_models += 1
            n = self._new_models
        model = model_pb2.Model()
        model.CopyFrom(self.base.model())
        model.name = f"soak_model_{n}"
        path = os.path.join(self.workdir, f"new_{n}.bin")
        write_bin(path, [model], self.base.blobs)
        return path

    def pause(self, seconds: float) -> None:
        self.stop.wait(seconds)

    # Each worker loops until the run ends; every call has the client's own deadline.
    def infer_loop(self, kind: str, data_channel: bool) -> None:
        with self.client(data_channel=data_channel) as board:
            sha = board.ensure_model(self.model_path)
            expected = board.infer(sha, "", [self.x]).outputs

            def call():
                out = board.infer(sha, "", [self.x]).outputs
                if list(out) != list(expected) or not all(np.array_equal(out[n], expected[n]) for n in expected):
                    raise AssertionError("infer outputs differ from the first reply")

            while not self.stop.is_set():
                timed(self.tally, kind, call)
                self.pause(self.args.infer_pause)

    def upload_loop(self) -> None:
        with self.client() as board:
            known = board.ensure_model(self.model_path)
            i = 0
            while not self.stop.is_set():
                i += 1
                if i % 2:
                    timed(self.tally, "upload_known", lambda: board.upload(self.model_path, known))
                else:
                    path = self.new_model()

                    def call():
                        sha = board.ensure_model(path)
                        board.load(sha)
                        board.infer(sha, "", [self.x])
                        board.unload(sha)

                    timed(self.tally, "upload_new", call)
                    os.unlink(path)
                self.pause(0.5)

    def upload_shared_loop(self) -> None:
        """A new model sent by several clients at once: one upload slot, one stored copy, every client served."""
        clients = [self.client() for _ in range(self.args.shared_uploaders)]
        try:
            while not self.stop.is_set():
                path = self.new_model()
                start = threading.Barrier(len(clients))
                results: Dict[int, str] = {}

                def send(i: int, board) -> None:
                    start.wait(timeout=30)
                    results[i] = board.ensure_model(path)

                def call():
                    senders = [threading.Thread(target=guarded_call, args=(send, i, board, results))
                               for i, board in enumerate(clients)]
                    for t in senders:
                        t.start()
                    for t in senders:
                        t.join()
                    errors = [v for v in results.values() if isinstance(v, Exception)]
                    if errors:
                        raise errors[0]
                    sha = results[0]
                    if set(results.values()) != {sha} or len(results) != len(clients):
                        raise AssertionError(f"shared upload: the clients got {sorted(set(map(str, results.values())))}")
                    clients[0].load(sha)
                    clients[0].infer(sha, "", [self.x])
                    clients[0].unload(sha)

                timed(self.tally, "upload_shared", call)
                os.unlink(path)
                self.pause(2.0)
        finally:
            for board in clients:
                board.close()

    def metrics_loop(self) -> None:
        """Scrape the daemon's /metrics; its counters only ever go up."""
        import urllib.request

        url = f"http://{self.metrics_target}/metrics"
        seen: Dict[str, float] = {}

        def call():
            with urllib.request.urlopen(url, timeout=10) as reply:
                text = reply.read().decode()
            counters = parse_counters(text)
            if not counters:
                raise AssertionError("the metrics hold no hrt_boardd counter")
            fell = [k for k, v in counters.items() if v < seen.get(k, 0)]
            if fell:
                raise AssertionError(f"metrics counters went down: {fell[:3]}")
            seen.update(counters)

        while not self.stop.is_set():
            timed(self.tally, "metrics", call)
            self.pause(2.0)

    def perf_loop(self, cancelled: bool) -> None:
        from bpuemu.board.runtime.perf_job import PerfConfig

        with self.client() as board:
            sha = board.ensure_model(self.model_path)
            while not self.stop.is_set():
                if cancelled:
                    cancel = threading.Event()
                    timer = threading.Timer(self.rng.uniform(0.2, 0.8), cancel.set)
                    timer.start()
                    timed(self.tally, "perf_cancel", lambda: board.perf(sha, "", PerfConfig(perf_time_minutes=0.05),
                                                                        cancel=cancel))
                    timer.cancel()
                    self.pause(1.0)
                else:
                    timed(self.tally, "perf", lambda: board.perf(sha, "", PerfConfig(frame_count=self.args.perf_frames)))
                    self.pause(2.0)

    def health_loop(self) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from bpuemu.common.errors import BoardUnavailable

        with grpc.insecure_channel(self.target) as channel, self.client() as board:
            stub = health_pb2_grpc.HealthStub(channel)

            def call():
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
                except grpc.RpcError as err:
                    raise BoardUnavailable(f"health check failed: {err.code().name}") from None
                if status != health_pb2.HealthCheckResponse.SERVING:
                    raise BoardUnavailable(f"health is {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}")
                board.stats()

            while not self.stop.is_set():
                timed(self.tally, "health", call)
                self.pause(1.0)

    def fault_loop(self) -> None:
        """Start a client process, wait until it is mid-call, SIGKILL it."""
        while not self.stop.is_set():
            self.pause(self.args.fault_every)
            if self.stop.is_set():
                break
            kind = self.rng.choice(self.args.fault_kinds)
            model = self.new_model() if kind == "upload" else self.model_path
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--fault-client", kind,
                                     "--board", self.target, "--model", model],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
            self.children.append(proc)
            ready = threading.Timer(30, proc.kill)  # bounded: a client that never gets to its call
            ready.start()
            line = proc.stdout.readline()
            ready.cancel()
            if line.strip() != "calling":
                proc.kill()
                _, err = proc.communicate()
                self.tally.error(f"fault_{kind}", "ClientFailed", f"the fault client failed before its call: {err.strip()}")
            else:
                self.pause(self.rng.uniform(0.1, 0.6))  # mid-call
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    self.tally.killed()
                proc.communicate()
                if proc.returncode != -signal.SIGKILL:
                    self.tally.error(f"fault_{kind}", "ClientFailed", f"the fault client ended with {proc.returncode} "
                                                                      "before it could be killed")
            self.children.remove(proc)
            if kind == "upload":
                os.unlink(model)

    def workers(self) -> Dict[str, Callable[[], None]]:
        return {
            "infer_data": lambda: self.infer_loop("infer_data", True),
            "infer_grpc": lambda: self.infer_loop("infer_grpc", False),
            "upload": self.upload_loop,
            "perf": lambda: self.perf_loop(False),
            "perf_cancel": lambda: self.perf_loop(True),
            "upload_shared": self.upload_shared_loop,
            "health": self.health_loop,
            "metrics": self.metrics_loop,
            "faults": self.fault_loop,
        }


def guarded_call(fn, i, board, results) -> None:
    """Run fn(i, board) in a thread; an exception becomes results[i]."""
    try:
        fn(i, board)
    except Exception as exc:
        results[i] = exc


def parse_counters(text: str) -> Dict[str, float]:
    """The hrt_boardd_*_total samples of a Prometheus text page, by name and labels."""
    out = {}
    for line in text.splitlines():
        if line.startswith("hrt_boardd_") and "_total" in line.split("{")[0].split(" ")[0]:
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def guarded(soak: Soak, name: str, fn: Callable[[], None]) -> Callable[[], None]:
    """A worker whose setup failure is recorded (and ends that worker), not lost in a thread."""
    def run():
        try:
            fn()
        except Exception as exc:
            soak.tally.error(name, "WorkerDied", f"{type(exc).__name__}: {exc}")

    return run


# --- a fault client ------------------------------------------------------------------------

def fault_client(kind: str, target: str, model_path: str) -> int:
    """Start one long call and say "calling" just before it; the soak kills this process mid-call."""
    from bpuemu.board.client import BoardClient
    from bpuemu.board.runtime.perf_job import PerfConfig
    from bpuemu.common.container import file_sha256, read_bin
    from bpuemu.common.input_types import random_rt_input
    from bpuemu.common.proto import board_pb2, board_pb2_grpc

    def calling():
        print("calling", flush=True)

    with BoardClient(target, client_name="bench-soak-fault", data_channel=kind != "infer_grpc") as board:
        board.info  # handshake first: the kill must land mid-call, not mid-connect
        if kind == "upload":  # header and half the bytes, then a stall: the daemon holds a partial upload
            data = open(model_path, "rb").read()
            sha = file_sha256(model_path)

            def chunks():
                yield board_pb2.UploadChunk(header=board_pb2.UploadHeader(sha256=sha, size=len(data), file_name="fault.bin"))
                yield board_pb2.UploadChunk(data=data[: len(data) // 2])
                calling()
                time.sleep(60)

            board_pb2_grpc.BoardStub(board._channel).UploadModel(chunks(), timeout=90)
            return 0
        sha = board.ensure_model(model_path)
        board.load(sha)
        x = random_rt_input(read_bin(model_path).model().input_specs[0], np.random.default_rng(0))
        board.infer(sha, "", [x])  # the data channel is open now
        calling()
        if kind == "perf":
            board.perf(sha, "", PerfConfig(perf_time_minutes=1.0))
        else:
            board.infer(sha, "", [x], frame_count=200_000)
    return 0


# --- the run -------------------------------------------------------------------------------

def percentiles(values: List[float]) -> str:
    if not values:
        return "      -/-      "
    return f"{np.percentile(values, 50):6.2f}/{np.percentile(values, 99):<7.2f}"


def report_interval(t_min: float, interval: dict, figures: Dict[str, float]) -> None:
    lat = interval["lat"]
    every = [v for values in lat.values() for v in values]
    print(f"{t_min:6.2f} {interval['calls']:6d} {interval['unexpected']:5d} {interval['expected']:5d} "
          f"{interval['kills']:5d}  {percentiles(lat.get('infer_data', []))} {percentiles(lat.get('infer_grpc', []))} "
          f"{percentiles(every)} {figures['rss_mb']:8.1f} {figures.get('anon_mb', 0.0):7.1f} {figures['fds']:5d} {figures['threads']:5d}", flush=True)


def run(args, workdir: str) -> int:
    from bpuemu.host.samples import sample_bin  # host-side: builds the sample model

    log_path = args.daemon_log or os.path.join(workdir, "hrt_boardd.log")
    model_path = os.path.join(workdir, "soak.bin")
    sample_bin(model_path, input_type_rt="rgb", height=args.size, width=args.size)
    from bpuemu.host.samples.daemon import start_daemon

    metrics_target = f"127.0.0.1:{free_port()}"
    proc, target = start_daemon(os.path.join(workdir, "models"), log_path,
                                extra_args=("--max-jobs", "16", "--log-level", "WARNING",
                                            "--metrics-listen", metrics_target))
    soak = Soak(args, workdir, target, model_path)
    with soak.client() as board:  # stored and loaded once, before the clients start
        board.load(board.ensure_model(model_path))
    soak.metrics_target = metrics_target
    workers = {name: fn for name, fn in soak.workers().items() if name in args.workers}
    threads = [threading.Thread(target=guarded(soak, name, fn), name=f"soak-{name}", daemon=True)
               for name, fn in workers.items()]
    print(f"soak of hrt_boardd at {target} (pid {proc.pid}) for {args.minutes:g} min, a line every {args.interval:g} s; "
          f"workers: {', '.join(workers)}", flush=True)
    print("  min  calls unexp   exp kills  infer_data p50/p99 infer_grpc p50/p99   all p50/p99 ms    RSS MB anon MB   fds  thr",
          flush=True)
    samples = []
    failed = []
    try:
        for t in threads:
            t.start()
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        next_tick = t0 + args.interval
        while True:
            now = time.monotonic()
            time.sleep(max(0.0, min(next_tick, end) - now))
            if proc.poll() is not None:
                failed.append(f"hrt_boardd died (exit {proc.returncode})")
                break
            figures = process_figures(proc.pid)
            samples.append(figures)
            report_interval((time.monotonic() - t0) / 60, soak.tally.take_interval(), figures)
            if time.monotonic() >= end - 0.05:
                break
            next_tick += args.interval
        soak.stop.set()
        for t in threads:
            t.join(timeout=180)
        if any(t.is_alive() for t in threads):
            failed.append("workers did not stop within 180 s of the end: " +
                          ", ".join(t.name for t in threads if t.is_alive()))
        failed += final_checks(soak, proc, workdir, log_path, samples)
    finally:
        soak.stop.set()
        for child in list(soak.children):
            child.kill()
        code = stop_daemon(proc)
    if code != 0:
        failed.append(f"hrt_boardd exited {code} on SIGTERM")
    if "Traceback" in open(log_path, errors="replace").read():
        failed.append(f"the daemon logged a traceback (see {log_path})")
    print_summary(soak.tally, samples, args)
    failed += goals(soak.tally, samples, args)
    print("RESULT     : " + ("FAIL: " + "; ".join(failed) if failed else
                             "PASS (0 unexpected errors, RSS growth and fds within bounds, store clean, clean exit)"))
    return 1 if failed else 0


def final_checks(soak: Soak, proc, workdir: str, log_path: str, samples) -> List[str]:
    """After the clients stopped: job slots free, no partial upload, the daemon serving."""
    problems = []
    with soak.client() as board:
        deadline = time.monotonic() + 30
        while board.stats().jobs_running and time.monotonic() < deadline:
            time.sleep(0.2)
        if board.stats().jobs_running:
            problems.append(f"{board.stats().jobs_running} jobs still running 30 s after the clients stopped")
        store = os.path.join(workdir, "models")
        deadline = time.monotonic() + 30
        while any(f.startswith(".upload-") for f in os.listdir(store)) and time.monotonic() < deadline:
            time.sleep(0.2)
        partial = [f for f in os.listdir(store) if f.startswith(".upload-")]
        if partial:
            problems.append(f"partial uploads left in the store: {partial}")
        stats = board.stats()
        print(f"\nboard counters: {stats.infer_calls} infer calls ({stats.infer_errors} with an error), "
              f"{stats.infer_frames} frames, {stats.perf_jobs} perf jobs, {stats.uploads} uploads, "
              f"{stats.refused_busy} refused busy; {len(board.list_models())} models stored")
    return problems


def stop_daemon(proc) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def print_summary(tally: Tally, samples, args) -> None:
    print("\ncalls by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(tally.calls.items())) +
          f"; clients killed mid-call: {tally.kills}")
    print(f"total calls : {sum(tally.calls.values())}")
    if tally.errors:
        print("errors by kind:")
        for (kind, error), n in sorted(tally.errors.items()):
            tag = "expected" if (kind, error) in EXPECTED else "UNEXPECTED"
            print(f"  {kind:12s} {error:20s} {n:6d}  {tag}: {tally.first_message[(kind, error)]}")
    else:
        print("errors by kind: none")


def goals(tally: Tally, samples, args) -> List[str]:
    failed = []
    if tally.unexpected:
        failed.append(f"{tally.unexpected} unexpected errors")
    if len(samples) >= 2:
        warm, last = samples[0], samples[-1]
        growth = last["rss_mb"] - warm["rss_mb"]
        peak = max(s["rss_mb"] for s in samples[1:]) - warm["rss_mb"]
        fds = last["fds"] - warm["fds"]
        threads = last["threads"] - warm["threads"]
        slope = rss_slope(samples, args.interval)
        judged_minutes = (len(samples) - 2) * args.interval / 60
        print(f"daemon RSS  : {warm['rss_mb']:.1f} MB after warm-up, {last['rss_mb']:.1f} MB at the end: "
              f"growth {growth:+.1f} MB (peak {peak:+.1f} MB; bound {args.rss_bound_mb:g} MB)")
        judged = judged_minutes >= args.slope_min_minutes
        print(f"RSS slope   : {slope:+.2f} MB/hour after warm-up (least squares over {len(samples) - 1} intervals); "
              f"in a week: {last['rss_mb'] + max(0.0, slope) * 24 * 7:.0f} MB; bound {args.max_slope_mb_per_hour:g} MB/hour"
              + ("" if judged else f", not judged: under {args.slope_min_minutes:g} min after warm-up"))
        print(f"anon RSS    : {warm.get('anon_mb', 0.0):.1f} -> {last.get('anon_mb', 0.0):.1f} MB, slope "
              f"{rss_slope(samples, args.interval, 'anon_mb'):+.2f} MB/hour (the heaps; the rest is the libraries' pages)")
        print(f"daemon fds  : {warm['fds']} after warm-up, {last['fds']} at the end "
              f"(min {min(s['fds'] for s in samples[1:])}, max {max(s['fds'] for s in samples[1:])}; slack {args.fd_slack})")
        print(f"threads     : {warm['threads']} after warm-up, {last['threads']} at the end "
              f"(min {min(s['threads'] for s in samples[1:])}, max {max(s['threads'] for s in samples[1:])}; "
              f"slack {args.thread_slack})")
        if growth > args.rss_bound_mb:
            failed.append(f"RSS grew {growth:.1f} MB after warm-up")
        if judged and slope > args.max_slope_mb_per_hour:
            failed.append(f"RSS slope {slope:.2f} MB/hour over {args.max_slope_mb_per_hour:g}")
        if fds > args.fd_slack:
            failed.append(f"open fds grew by {fds}")
        if threads > args.thread_slack:
            failed.append(f"threads grew by {threads}")
    else:
        failed.append("too short a run to judge RSS and fds (fewer than 2 intervals)")
    if "faults" in args.workers and tally.kills == 0 and args.minutes * 60 > 2 * args.fault_every:
        failed.append("no client was killed mid-call")
    return failed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long to run")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between report lines (the first is the warm-up)")
    p.add_argument("--size", type=int, default=32, help="input height and width of the sample model")
    p.add_argument("--infer-pause", type=float, default=0.01, help="seconds each infer client waits between calls")
    p.add_argument("--perf-frames", type=int, default=100, help="frames of each perf job")
    p.add_argument("--fault-every", type=float, default=5.0, help="seconds between killed client processes")
    p.add_argument("--rss-bound-mb", type=float, default=32.0, help="largest acceptable RSS growth after warm-up")
    p.add_argument("--max-slope-mb-per-hour", type=float, default=2.0,
                   help="largest acceptable RSS slope after warm-up (judged on runs of --slope-min-minutes or more)")
    p.add_argument("--slope-min-minutes", type=float, default=20.0,
                   help="judge the RSS slope only when this many minutes of intervals follow the warm-up")
    p.add_argument("--fd-slack", type=int, default=8, help="largest acceptable growth of open fds after warm-up")
    p.add_argument("--thread-slack", type=int, default=8,
                   help="largest acceptable growth of the daemon's threads after warm-up (perf jobs come and go)")
    p.add_argument("--fault-kinds", default=",".join(FAULT_KINDS),
                   help=f"comma-separated kinds of call the faults worker's clients are killed in (default all: "
                        f"{','.join(FAULT_KINDS)})")
    p.add_argument("--shared-uploaders", type=int, default=3, help="clients sending each shared upload at once")
    p.add_argument("--workers", default=",".join(WORKERS),
                   help=f"comma-separated workers to run (default all: {','.join(WORKERS)})")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault schedule")
    p.add_argument("--daemon-log", default="", help="write the daemon's log here (default: a temporary file)")
    p.add_argument("--fault-client", choices=FAULT_KINDS, help=argparse.SUPPRESS)
    p.add_argument("--board", default="", help=argparse.SUPPRESS)
    p.add_argument("--model", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.fault_client:
        return fault_client(args.fault_client, args.board, args.model)
    args.workers = [w.strip() for w in args.workers.split(",") if w.strip()]
    unknown = sorted(set(args.workers) - set(WORKERS))
    if unknown or not args.workers:
        sys.exit(f"--workers: unknown {', '.join(unknown)} (known: {', '.join(WORKERS)})" if unknown else "--workers: none given")
    args.fault_kinds = [k.strip() for k in args.fault_kinds.split(",") if k.strip()]
    unknown = sorted(set(args.fault_kinds) - set(FAULT_KINDS))
    if unknown or not args.fault_kinds:
        sys.exit(f"--fault-kinds: unknown {', '.join(unknown)} (known: {', '.join(FAULT_KINDS)})" if unknown
                 else "--fault-kinds: none given")
    if args.minutes <= 0 or args.interval <= 0 or args.minutes > 24 * 60:
        sys.exit("--minutes must be in (0, 1440] and --interval positive")
    with tempfile.TemporaryDirectory(prefix="bpuemu-soak-") as workdir:
        return run(args, workdir)


if __name__ == "__main__":
    sys.exit(main())
