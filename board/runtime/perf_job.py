"""A perf job (hrt_model_exec perf): frames run by thread_num threads on the board itself.

Each worker takes the next frame number, runs it, and records its latency
(from submission to the end of its last step). The run stops after
frame_count frames, or after perf_time minutes when that is set. Results are
what the real tool prints (Running condition / Perf result) plus latency
percentiles, and, when profiling, profiler.log and profiler.csv.
"""
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from bpuemu.common import x5_timing
from bpuemu.common.errors import Cancelled, InvalidInput
from bpuemu.common.input_types import random_rt_inputs
from bpuemu.board.runtime.model import LoadedModel
from bpuemu.board.runtime.profiler import FrameTimes, Profiler

MAX_THREADS = 8


@dataclass
class PerfConfig:
    frame_count: int = 200
    perf_time_minutes: float = 0.0
    thread_num: int = 1
    core_id: int = 0
    profile: bool = False

    def validate(self, max_frame_count: int = 0, max_perf_time_minutes: float = 0.0) -> None:
        if not 1 <= self.thread_num <= MAX_THREADS:
            raise InvalidInput(f"thread_num must be in [1,{MAX_THREADS}], got {self.thread_num}")
        if self.perf_time_minutes < 0:
            raise InvalidInput(f"perf_time must be >= 0 minutes, got {self.perf_time_minutes}")
        if self.perf_time_minutes == 0 and self.frame_count < 1:
            raise InvalidInput(f"frame_count must be >= 1, got {self.frame_count}")
        if self.core_id < 0:
            raise InvalidInput(f"core_id must be >= 0, got {self.core_id}")
        if max_frame_count and self.perf_time_minutes == 0 and self.frame_count > max_frame_count:
            raise InvalidInput(f"frame_count {self.frame_count} is over this board's limit of {max_frame_count}")
        if max_perf_time_minutes and self.perf_time_minutes > max_perf_time_minutes:
            raise InvalidInput(f"perf_time {self.perf_time_minutes} min is over this board's limit of {max_perf_time_minutes} min")


@dataclass
class PerfReport:
    model_name: str
    thread_num: int
    frame_count: int
    core_id: int
    run_time_ms: float
    total_latency_ms: float
    average_latency_ms: float
    fps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    profiler_log: str = ""
    profiler_csv: str = ""

    #: Every figure of the report: all fields but the profiler files' text.
    SUMMARY_FIELDS = ("model_name", "thread_num", "frame_count", "core_id", "run_time_ms", "total_latency_ms",
                      "average_latency_ms", "fps", "p50_ms", "p90_ms", "p99_ms")

    def summary(self) -> dict:
        """Every figure of the report (``SUMMARY_FIELDS``), for hrt_model_exec --json."""
        return {f: getattr(self, f) for f in self.SUMMARY_FIELDS}

    def console(self) -> str:
        """The console block the real hrt_model_exec prints, plus percentiles."""
        return (
            "Running condition:\n"
            f"  Thread number is: {self.thread_num}\n"
            f"  Frame count   is: {self.frame_count}\n"
            f"  Program run time: {self.run_time_ms:.6f} ms\n"
            "Perf result:\n"
            f"  Frame totally latency is: {self.total_latency_ms:.6f} ms\n"
            f"  Average    latency    is: {self.average_latency_ms:.6f} ms\n"
            f"  Frame      rate       is: {self.fps:.6f} FPS\n"
            f"  Latency    p50/p90/p99 is: {self.p50_ms:.6f} / {self.p90_ms:.6f} / {self.p99_ms:.6f} ms"
        )


ProgressFn = Callable[[int, int, float], None]


def run_perf(
    model: LoadedModel,
    inputs: Sequence[np.ndarray],
    config: PerfConfig,
    progress: Optional[ProgressFn] = None,
    cancelled: Optional[Callable[[], bool]] = None,
    progress_interval_s: float = 0.25,
) -> PerfReport:
    """Run a perf job and return its report. Raises Cancelled when asked to stop.

    With no ``inputs``, every frame runs the same seeded random inputs.
    """
    config.validate()
    inputs = list(inputs) or random_rt_inputs(model.model.input_specs)
    profiler = Profiler() if config.profile else None
    if profiler:
        model.open_pieces()   # profiled frames run the plan's pieces one by one: their sessions open first
    try:
        job = _FrameScheduler(model, inputs, config, profiler)
        run_time_ms = job.run(progress, cancelled, progress_interval_s)
    finally:
        if profiler:
            model.close_pieces()   # the job's end: the pieces' sessions close again (the merged one stays)
    report = _statistics(model.name, config, job.latencies, run_time_ms)
    if profiler:
        report.profiler_log, report.profiler_csv = _profiler_files(profiler, report, config, model.model)
    return report


class _FrameScheduler:
    """thread_num workers take frame numbers until frame_count (or perf_time) is reached."""

    def __init__(self, model: LoadedModel, inputs: List[np.ndarray], config: PerfConfig, profiler: Optional[Profiler]):
        self.model, self.inputs, self.profiler = model, inputs, profiler
        self.thread_num = config.thread_num
        self.time_bound = config.perf_time_minutes > 0
        self.total = 0 if self.time_bound else config.frame_count
        self.deadline_ns = time.perf_counter_ns() + int(config.perf_time_minutes * 60e9) if self.time_bound else 0
        self.lock = threading.Lock()
        self.latencies: List[float] = []
        self.next = 0
        self.error: Optional[BaseException] = None
        self.stop = False
        self.running = config.thread_num
        self.finished = threading.Event()  # set by the last worker to leave

    def claim(self) -> bool:
        """The next frame number, if there is one to run."""
        with self.lock:
            if self.stop or self.error is not None:
                return False
            if self.time_bound:
                if time.perf_counter_ns() >= self.deadline_ns:
                    return False
            elif self.next >= self.total:
                return False
            self.next += 1
            return True

    def worker(self) -> None:
        try:
            while self.claim():
                submitted = time.perf_counter_ns()
                times = FrameTimes() if self.profiler else None
                self.model.run(self.inputs, times=times, submitted_ns=submitted)
                latency = (time.perf_counter_ns() - submitted) / 1e6
                with self.lock:
                    self.latencies.append(latency)
                if self.profiler:
                    self.profiler.add_frame(times)
        except BaseException as exc:  # handed to the caller's thread by run()
            with self.lock:
                if self.error is None:
                    self.error = exc
        finally:
            with self.lock:
                self.running -= 1
                if self.running == 0:
                    self.finished.set()

    def run(self, progress: Optional[ProgressFn], cancelled: Optional[Callable[[], bool]], interval_s: float) -> float:
        """Run every frame; returns the run time in ms. Re-raises a worker's error; Cancelled when asked to stop."""
        threads = [threading.Thread(target=self.worker, name=f"perf-{i}", daemon=True) for i in range(self.thread_num)]
        start = time.perf_counter_ns()
        for t in threads:
            t.start()
        try:
            while not self.finished.wait(interval_s):
                if cancelled is not None and cancelled():
                    with self.lock:
                        self.stop = True
                if progress is not None:
                    with self.lock:
                        done = len(self.latencies)
                    progress(done, self.total, (time.perf_counter_ns() - start) / 1e9)
        except BaseException:
            # Ctrl-C: every worker finishes its frame before the process exits (one exiting while
            # onnxruntime runs in a worker aborts: "terminate called ..."). An Event, not join():
            # a join interrupted by Ctrl-C may report a running thread as finished.
            with self.lock:
                self.stop = True
            self.finished.wait()
            raise
        run_time_ms = (time.perf_counter_ns() - start) / 1e6
        if self.error is not None:
            raise self.error
        if self.stop:
            raise Cancelled(f"perf on '{self.model.name}' cancelled after {len(self.latencies)} frames")
        if progress is not None:
            # The final count: a job can end between two ticks, or before the first one.
            progress(len(self.latencies), self.total, run_time_ms / 1e3)
        return run_time_ms


def _statistics(model_name: str, config: PerfConfig, latencies: List[float], run_time_ms: float) -> PerfReport:
    """Frame rate, total/average latency and percentiles of one run."""
    lat = np.asarray(latencies, dtype=np.float64)
    n = len(lat)
    total_latency = float(lat.sum())
    p50, p90, p99 = (float(np.percentile(lat, q)) for q in (50, 90, 99)) if n else (0.0, 0.0, 0.0)
    return PerfReport(
        model_name=model_name,
        thread_num=config.thread_num,
        frame_count=n,
        core_id=config.core_id,
        run_time_ms=run_time_ms,
        total_latency_ms=total_latency,
        average_latency_ms=total_latency / n if n else 0.0,
        fps=n / (run_time_ms / 1e3) if run_time_ms > 0 else 0.0,
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
    )


def modeled_x5(model, thread_num: int, frame_count: int):
    """(ModeledPerf, ModelSteps) of the X5 timing stored in ``model`` (a model_pb2.Model) for this run,
    or (None, None) when the .bin has none (x5_timing.NO_TIMING)."""
    if not x5_timing.has_timing(model):
        return None, None
    steps = x5_timing.march_steps(model)   # a J6 model's: scaled per its march (labelled in x5_text)
    return x5_timing.schedule(steps, min(max(thread_num, 1), MAX_THREADS), max(frame_count, 1)), steps


def x5_summary(model, thread_num: int, frame_count: int) -> dict:
    """The X5 block of hrt_model_exec perf --json (bpuemu.common.exec_json): the modeled figures, or the reason."""
    run, steps = modeled_x5(model, thread_num, frame_count)
    if run is None:
        return {"error": x5_timing.NO_TIMING}
    return {**run.summary(), "modeled": x5_timing.timing_header(model).rstrip(":"),
            "estimate_line": x5_timing.estimate_line(model), "parameters": steps.parameters,
            "steps_us": {s.name: s.us for s in steps.steps}, "task_overhead_us": steps.task_overhead_us}


def x5_text(model, thread_num: int, frame_count: int) -> str:
    """The X5 block of hrt_model_exec perf's console output."""
    run, steps = modeled_x5(model, thread_num, frame_count)
    if run is None:
        return f"X5 model: {x5_timing.NO_TIMING}"
    return x5_timing.timing_text(run, steps, x5_timing.estimate_line(model), x5_timing.timing_header(model))


def _profiler_files(profiler: Profiler, report: PerfReport, config: PerfConfig, model=None) -> Tuple[str, str]:
    """profiler.log (the seed's two JSON documents) and profiler.csv of one run; with the model's stored
    X5 timing, each node also gets its modeled X5 time (``x5_time``, ms) and the run its modeled figures."""
    if model is not None and x5_timing.has_timing(model):
        steps = x5_timing.march_steps(model)
        profiler.x5_ms = {s.name: s.us / 1e3 for s in steps.steps}
        profiler.x5_run = x5_summary(model, config.thread_num, report.frame_count)
    log = profiler.profiler_log(
        {"FPS": report.fps, "average_latency": report.average_latency_ms},
        {
            "core_id": config.core_id,
            "frame_count": report.frame_count,
            "model_name": report.model_name,
            "run_time": report.run_time_ms,
            "thread_num": config.thread_num,
        },
    )
    return log, profiler.profiler_csv()
