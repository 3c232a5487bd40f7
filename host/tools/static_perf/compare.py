"""hb_perf --compare: the static estimate next to what ``hrt_model_exec perf --profile_path`` measured.

profiler.log holds two JSON documents separated by a line ``***`` (the seed's
format, bpuemu.board.runtime.profiler): the first has ``running_condition``
(model_name, thread_num, ...), the second ``model_latency`` with avg/max/min
milliseconds per plan step name and ``processor_latency`` with the BPU and
CPU totals. Plan step names are what join the two: the estimate's BPU
subgraphs are ``BPU_<model>_subgraph_<i>`` in both.
"""
import json
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.host.compiler.timing.estimate import ModelEstimate

_SEPARATOR = re.compile(r"^\s*\*\*\*\s*$", re.MULTILINE)


@dataclass
class CompareRow:
    name: str
    processor: str
    estimate_ms: Optional[float]
    measured_avg_ms: Optional[float]
    measured_min_ms: Optional[float]
    measured_max_ms: Optional[float]

    @property
    def ratio(self) -> Optional[float]:
        if self.estimate_ms and self.measured_avg_ms is not None:
            return self.measured_avg_ms / self.estimate_ms
        return None


def read_profiler_log(text: str, source: str = "profiler.log") -> Tuple[dict, dict]:
    """The two documents of a profiler.log."""
    parts = _SEPARATOR.split(text)
    if len(parts) != 2:
        raise InvalidInput(f"{source} is not a profiler.log: expected two JSON documents separated by a '***' line",
                           hint="write one with: hrt_model_exec perf --model_file M.bin --profile_path DIR")
    docs = []
    for i, part in enumerate(parts):
        try:
            docs.append(json.loads(part))
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{source}: document {i + 1} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    first, second = docs
    if "model_latency" not in second:
        raise InvalidInput(f"{source}: the second document has no 'model_latency'")
    return first, second


def read_profiler_file(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        raise NotFound(f"profiler log not found: {path}") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read {path} as a profiler.log: {exc}") from None


def profiler_log_for(model_name: str, text: str, source: str = "profiler.log") -> Tuple[dict, dict]:
    """The documents of a profiler.log, checked to be a measurement of ``model_name``."""
    first, second = read_profiler_log(text, source)
    measured_model = first.get("running_condition", {}).get("model_name", "")
    if measured_model and measured_model != model_name:
        raise InvalidInput(f"{source} was measured on model '{measured_model}', the estimate is for '{model_name}'",
                           hint="pick the model with -m, or profile the same model")
    return first, second


def compare(est: ModelEstimate, text: str, source: str = "profiler.log") -> List[CompareRow]:
    """One row per BPU subgraph, then every CPU step the log timed, then the BPU total."""
    _, second = profiler_log_for(est.model_name, text, source)
    latency: Dict[str, dict] = second["model_latency"]
    names = [s.name for s in est.subgraphs]
    if names and not any(n in latency for n in names):
        raise NotFound(f"{source} has no timings for the BPU subgraphs of '{est.model_name}' ({', '.join(names)}); "
                       f"it lists: {', '.join(sorted(latency)) or 'nothing'}")

    def row(name, proc, estimate_ms):
        m = latency.get(name)
        return CompareRow(name, proc, estimate_ms, *(m.get(k) if m else None for k in ("avg_time", "min_time", "max_time")))

    rows = [row(s.name, "BPU", s.latency_us / 1e3) for s in est.subgraphs]
    rows += [row(s.name, "BPU" if s.on_bpu else "CPU", s.latency_us / 1e3) for s in est.cpu_steps if s.name in latency]
    bpu_total = second.get("processor_latency", {}).get("BPU_inference_time_cost", {})
    rows.append(CompareRow("BPU total", "BPU", est.latency_ms, bpu_total.get("avg_time"), bpu_total.get("min_time"),
                           bpu_total.get("max_time")))
    return rows


def compare_text(rows: List[CompareRow]) -> str:
    def ms(v):
        return "--" if v is None else f"{v:.6f}"

    headers = ["node", "on", "estimate(ms)", "measured avg(ms)", "min(ms)", "max(ms)", "measured/estimate"]
    table = [[r.name, r.processor, ms(r.estimate_ms), ms(r.measured_avg_ms), ms(r.measured_min_ms), ms(r.measured_max_ms),
              "--" if r.ratio is None else f"{r.ratio:.2f}x"] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(headers), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    out += [line(r) for r in table]
    out.append("estimate: bpuemu's X5 timing model; measured: hrt_model_exec perf (the emulated runtime on the "
               "machine that ran it), so the ratio says how that machine compares with the modelled X5")
    return "\n".join(out)
