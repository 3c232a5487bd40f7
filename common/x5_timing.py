"""What the X5 would measure for a model: its plan's modeled step times, scheduled on the board.

hb_mapper makertbin runs the X5 timing model (bpuemu.host.compiler.timing:
per BPU layer, per CPU op, the input conversion and the ``_HzDequantize``
outputs, fitted to published RDK X5 measurements) and stores each plan step's
modeled time in the `.bin` (``PlanStep.x5_us``, ``Model.x5_timing``), as the
real compiler's output carries its estimate. This module turns those times into
what ``hrt_model_exec perf`` on an X5 would show, with no host code:

    steps = plan_steps(model)                        # NoX5Timing for a .bin made before
    perf = schedule(steps, thread_num=2, frame_count=200)
    perf.latency_ms, perf.fps

The board (8 Cortex-A55, one BPU core) runs ``thread_num`` threads, each taking
the next frame. A frame walks its plan in order after the runtime's task
overhead: a CPU step takes its time on the thread's own core (threads <= 8
cores, so CPU steps of different threads overlap), a BPU step waits for the one
BPU core. A frame reserves its BPU slots in the order frames are submitted
(first come, first served): with one thread the latency is the sum of the
steps; with several the BPU serializes them, so FPS tends to 1 / (BPU time per
frame) and the latency to thread_num / FPS, as the X5's published multi-thread
figures do.

``X5Clock`` is the same schedule against the wall clock: ``hrt_boardd --timing
x5`` and ``hrt_model_exec --timing x5`` make each frame last at least its
modeled time (sleeping the rest), with every model and thread of the process
sharing one modeled BPU.
"""
import heapq
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from bpuemu.common.errors import InvalidModelFile
from bpuemu.common.proto import model_pb2

#: The board's CPU cores (8x Cortex-A55 at 1.8 GHz): at most this many CPU steps run at once.
X5_CPU_CORES = 8

NO_TIMING = "no X5 timing in this model, rebuild with makertbin"


class NoX5Timing(InvalidModelFile):
    """The `.bin` was made before bpuemu's compiler stored X5 timing in it."""


@dataclass(frozen=True)
class StepTime:
    name: str
    on_bpu: bool
    us: float


@dataclass(frozen=True)
class ModeledPerf:
    """Modeled figures of a perf run on the X5 (``schedule``)."""

    thread_num: int
    frame_count: int
    latency_ms: float          # average per-frame latency (submission to end)
    fps: float                 # frames / time from the first start to the last end
    latency_1thread_ms: float  # one frame alone: the sum of its steps and the task overhead
    bpu_ms: float              # BPU time per frame
    cpu_ms: float              # CPU time per frame (steps and task overhead)

    def summary(self) -> dict:
        return {"thread_num": self.thread_num, "frame_count": self.frame_count,
                "latency_ms": self.latency_ms, "fps": self.fps, "latency_1thread_ms": self.latency_1thread_ms,
                "bpu_ms": self.bpu_ms, "cpu_ms": self.cpu_ms}


@dataclass(frozen=True)
class ModelSteps:
    """A model's modeled frame: the task overhead (CPU), then its plan steps in order."""

    model: str
    steps: Tuple[StepTime, ...]
    task_overhead_us: float
    parameters: str = ""

    @property
    def bpu_us(self) -> float:
        return sum(s.us for s in self.steps if s.on_bpu)

    @property
    def cpu_us(self) -> float:
        return self.task_overhead_us + sum(s.us for s in self.steps if not s.on_bpu)

    def segments(self) -> List[Tuple[bool, float]]:
        """(on_bpu, us) runs of consecutive steps on one processor, the overhead first."""
        out: List[Tuple[bool, float]] = [(False, self.task_overhead_us)]
        for s in self.steps:
            if s.us <= 0:
                continue                      # takes no time on either processor: splits no run
            if out and out[-1][0] == s.on_bpu:
                out[-1] = (s.on_bpu, out[-1][1] + s.us)
            else:
                out.append((s.on_bpu, s.us))
        return out


def on_bpu(step: model_pb2.PlanStep) -> bool:
    """Where the X5 runs a plan step: BPU subgraphs, the input conversion compiled into one, and the
    steps the timing model marked (``x5_on_bpu``: CPU ops of the plan that the X5 runs on its BPU)."""
    kind = model_pb2.PlanStep
    return step.kind == kind.BPU_SUBGRAPH or (step.kind == kind.PREPROCESS and step.fused_into_subgraph) \
        or step.x5_on_bpu


def has_timing(model: model_pb2.Model) -> bool:
    return model.HasField("x5_timing")


def plan_steps(model: model_pb2.Model) -> ModelSteps:
    """The modeled steps stored in ``model``; NoX5Timing when it has none."""
    if not has_timing(model):
        raise NoX5Timing(f"model '{model.name}': {NO_TIMING}")
    return ModelSteps(model.name, tuple(StepTime(s.name, on_bpu(s), max(0.0, s.x5_us)) for s in model.plan),
                      max(0.0, model.x5_timing.task_overhead_us), model.x5_timing.parameters)


def march_steps(model: model_pb2.Model) -> ModelSteps:
    """The modeled steps of ``model`` on the march it was compiled for: the X5's as stored; on a J6 march
    (no J6 board measurements exist) each BPU step's X5 time divided by the march's int8 TOPS ratio to the
    X5 and each CPU step's (and the task overhead) by its CPU speed ratio, both from ``March.timing``
    (bpuemu.common.march), whose ``label`` says what they rest on."""
    return steps_on_march(plan_steps(model), model.march)


def step_us_on_march(us: float, on_bpu: bool, march_name: str) -> float:
    """One X5 step time on ``march_name``: a BPU time divided by the march's int8 TOPS ratio to the X5, a CPU
    time by its CPU speed ratio (``March.timing``; both 1 on the X5)."""
    from bpuemu.common.march import march

    t = march(march_name or None).timing
    return us / (t.bpu_speed_vs_x5 if on_bpu else t.cpu_speed_vs_x5)


def steps_on_march(steps: ModelSteps, march_name: str) -> ModelSteps:
    """X5 modeled ``steps`` (stored in a model, or an estimate's) on ``march_name`` (``step_us_on_march``)."""
    from bpuemu.common.march import march

    t = march(march_name or None).timing
    if t.bpu_speed_vs_x5 == 1.0 and t.cpu_speed_vs_x5 == 1.0:
        return steps
    return ModelSteps(steps.model, tuple(StepTime(s.name, s.on_bpu, step_us_on_march(s.us, s.on_bpu, march_name))
                                         for s in steps.steps),
                      step_us_on_march(steps.task_overhead_us, False, march_name), steps.parameters)


def timing_header(model: model_pb2.Model) -> str:
    """The first line of a modeled timing block: which board it models and what the figures rest on."""
    from bpuemu.common.march import march

    m = march(model.march or None)
    if not m.is_j6:
        return "X5 model (bpuemu's timing model of an RDK X5: 1 BPU core, 8x Cortex-A55; not measured):"
    return f"{m.name} model ({m.platform}; {m.timing.label}):"


def _walk(segments: Sequence[Tuple[bool, float]], start: float, bpu_free: float) -> Tuple[float, float]:
    """(end, BPU free-at) of one frame started at ``start`` (us), reserving its BPU time after ``bpu_free``."""
    t = start
    for is_bpu, us in segments:
        if is_bpu:
            t = max(t, bpu_free) + us
            bpu_free = t
        else:
            t += us
    return t, bpu_free


def schedule(steps: ModelSteps, thread_num: int = 1, frame_count: int = 200) -> ModeledPerf:
    """The modeled perf run: ``thread_num`` threads (1..8) running ``frame_count`` frames on one X5."""
    if not 1 <= thread_num <= X5_CPU_CORES:
        raise ValueError(f"thread_num must be in [1,{X5_CPU_CORES}], got {thread_num}")
    frame_count = max(1, int(frame_count))
    segments = steps.segments()
    ready = [(0.0, i) for i in range(thread_num)]     # (time the thread takes its next frame, thread)
    heapq.heapify(ready)
    bpu_free, total, last = 0.0, 0.0, 0.0
    for _ in range(frame_count):
        start, thread = heapq.heappop(ready)
        end, bpu_free = _walk(segments, start, bpu_free)
        total += end - start
        last = max(last, end)
        heapq.heappush(ready, (end, thread))
    alone, _ = _walk(segments, 0.0, 0.0)
    return ModeledPerf(thread_num, frame_count, total / frame_count / 1e3, frame_count / (last / 1e6) if last > 0 else 0.0,
                       alone / 1e3, steps.bpu_us / 1e3, steps.cpu_us / 1e3)


class X5Clock:
    """The modeled X5 against the wall clock: one BPU shared by every frame of the process.

    ``deadline_ns(steps, start_ns)`` reserves the frame's BPU time (in the order
    frames ask) and returns when the frame ends on the X5; the caller sleeps
    until then once its real work is done (``wait_until``).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._bpu_free_us = 0.0

    def deadline_ns(self, steps: ModelSteps, start_ns: int) -> int:
        with self._lock:
            end, self._bpu_free_us = _walk(steps.segments(), start_ns / 1e3, self._bpu_free_us)
        return int(end * 1e3)

    @staticmethod
    def wait_until(deadline_ns: int) -> None:
        while True:
            left = deadline_ns - time.perf_counter_ns()
            if left <= 0:
                return
            time.sleep(left / 1e9)


def timing_text(perf: ModeledPerf, steps: ModelSteps, bpu_estimate_line: Optional[str] = None,
                header: str = "") -> str:
    """hrt_model_exec perf's X5 block: what the X5 would show for this run (``header``: timing_header's
    line for another march)."""
    lines = [
        header or "X5 model (bpuemu's timing model of an RDK X5: 1 BPU core, 8x Cortex-A55; not measured):",
        f"  Thread number is: {perf.thread_num}",
        f"  Frame count   is: {perf.frame_count}",
        f"  Average    latency    is: {perf.latency_ms:.6f} ms",
        f"  Frame      rate       is: {perf.fps:.6f} FPS",
        f"  1-thread latency      is: {perf.latency_1thread_ms:.6f} ms "
        f"(BPU {perf.bpu_ms:.6f} ms + CPU {perf.cpu_ms:.6f} ms per frame)",
    ]
    if bpu_estimate_line:
        lines.append(f"  compiler estimate (BPU only): {bpu_estimate_line}")
    return "\n".join(lines)


def estimate_line(model: model_pb2.Model, on_march: bool = True) -> str:
    """makertbin's estimate line from the stored timing: ``FPS=…, latency = … us, DDR = … bytes``; on the
    model's march (``march_steps``), or with ``on_march=False`` the X5's that the model stores."""
    t = march_steps(model) if on_march else plan_steps(model)
    bpu_us = t.bpu_us
    fps = f"{1e6 / bpu_us:.2f}" if bpu_us > 0 else "inf"
    return f"FPS={fps}, latency = {bpu_us:.1f} us, DDR = {model.x5_timing.ddr_bytes} bytes"


def march_estimate_line(model: model_pb2.Model) -> str:
    """The estimate line on the model's march with the frame's CPU work and what the figures rest on:
    ``FPS=…, latency = … us (BPU), DDR = … bytes; 1-thread latency = … us (BPU … us + CPU … us) [label]``
    (``march_steps`` and ``schedule``; the label is ``March.timing.label``)."""
    from bpuemu.common.march import march

    m = march(model.march or None)
    one = schedule(march_steps(model), thread_num=1, frame_count=1)
    return (f"{estimate_line(model)}; 1-thread latency = {one.latency_1thread_ms * 1e3:.1f} us "
            f"(BPU {one.bpu_ms * 1e3:.1f} us + CPU {one.cpu_ms * 1e3:.1f} us) "
            f"[{m.name} ({m.platform}) {m.timing.label}]")
