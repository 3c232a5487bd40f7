"""Per-node profiler: the data behind profiler.log and profiler.csv.

Names are the real runtime's: ``Preprocess``, ``BPU_<model>_subgraph_<i>``,
``<subgraph>_input_layout_convert``, ``<subgraph>_output_layout_convert``,
``<node>_HzDequantize`` and CPU op names. When the model carries X5 timing
(bpuemu.common.x5_timing), each node of ``model_latency`` also has ``x5_time``
(its modeled time on the X5, ms) and the first document ``x5_model`` (the
modeled figures of the run: latency, FPS, BPU and CPU per frame). ``BPU_inference_time_cost`` is the
per-frame sum of BPU subgraph time, ``CPU_inference_time_cost`` the per-frame
sum of everything else; ``TaskPendingTime`` is from a frame's submission to the
start of its first step, ``TaskRunningTime`` from there to its last step's end.
"""
import csv
import io
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List


@dataclass
class Stat:
    """Running avg/max/min of a duration, in ms."""

    count: int = 0
    total: float = 0.0
    max: float = 0.0
    min: float = float("inf")

    def add(self, ms: float) -> None:
        self.count += 1
        self.total += ms
        if ms > self.max:
            self.max = ms
        if ms < self.min:
            self.min = ms

    def merge(self, other: "Stat") -> None:
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)
        self.min = min(self.min, other.min)

    def as_dict(self) -> Dict[str, float]:
        if not self.count:
            return {"avg_time": 0.0, "max_time": 0.0, "min_time": 0.0}
        return {"avg_time": self.total / self.count, "max_time": self.max, "min_time": self.min}


@dataclass
class FrameTimes:
    """What one frame's run recorded; filled by LoadedModel.run."""

    steps: List[tuple] = field(default_factory=list)  # (name, is_bpu, ms)
    pending_ms: float = 0.0
    running_ms: float = 0.0


class Profiler:
    """Accumulates FrameTimes from any number of threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self.nodes: "OrderedDict[str, Stat]" = OrderedDict()
        self.kinds: Dict[str, str] = {}
        self.bpu = Stat()
        self.cpu = Stat()
        self.pending = Stat()
        self.running = Stat()
        self.x5_ms: Dict[str, float] = {}       # step -> modeled X5 time (ms), when the model has it
        self.x5_run: Dict[str, object] = {}

    def add_frame(self, frame: FrameTimes) -> None:
        with self._lock:
            bpu = cpu = 0.0
            for name, is_bpu, ms in frame.steps:
                stat = self.nodes.get(name)
                if stat is None:
                    stat = self.nodes[name] = Stat()
                    self.kinds[name] = "BPU" if is_bpu else "CPU"
                stat.add(ms)
                if is_bpu:
                    bpu += ms
                else:
                    cpu += ms
            self.bpu.add(bpu)
            self.cpu.add(cpu)
            self.pending.add(frame.pending_ms)
            self.running.add(frame.running_ms)

    def second_document(self) -> dict:
        return {
            "processor_latency": {
                "BPU_inference_time_cost": self.bpu.as_dict(),
                "CPU_inference_time_cost": self.cpu.as_dict(),
            },
            "model_latency": {name: self._node(name) for name in sorted(self.nodes)},
            "task_latency": {
                "TaskPendingTime": self.pending.as_dict(),
                "TaskRunningTime": self.running.as_dict(),
            },
        }

    def _node(self, name: str) -> Dict[str, float]:
        d = self.nodes[name].as_dict()
        if name in self.x5_ms:
            d["x5_time"] = self.x5_ms[name]
        return d

    def profiler_log(self, perf_result: dict, running_condition: dict) -> str:
        """profiler.log: two JSON documents separated by a ``***`` line (the seed's format)."""
        first = {"perf_result": perf_result, "running_condition": running_condition}
        if self.x5_run:
            first["x5_model"] = self.x5_run
        return json.dumps(first, indent=2) + "\n***\n" + json.dumps(self.second_document(), indent=2) + "\n"

    def profiler_csv(self) -> str:
        """profiler.csv: one row per node in execution order, then the totals."""
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        x5 = bool(self.x5_ms)
        w.writerow(["name", "processor", "count", "avg_time_ms", "max_time_ms", "min_time_ms"] + (["x5_time_ms"] if x5 else []))
        for name, stat in self.nodes.items():
            d = stat.as_dict()
            w.writerow([name, self.kinds[name], stat.count, f"{d['avg_time']:.6f}", f"{d['max_time']:.6f}", f"{d['min_time']:.6f}"]
                       + ([f"{self.x5_ms[name]:.6f}" if name in self.x5_ms else ""] if x5 else []))
        for name, stat, proc in (
            ("BPU_inference_time_cost", self.bpu, "BPU"),
            ("CPU_inference_time_cost", self.cpu, "CPU"),
            ("TaskPendingTime", self.pending, "task"),
            ("TaskRunningTime", self.running, "task"),
        ):
            d = stat.as_dict()
            w.writerow([name, proc, stat.count, f"{d['avg_time']:.6f}", f"{d['max_time']:.6f}", f"{d['min_time']:.6f}"]
                       + ([""] if x5 else []))
        return out.getvalue()
