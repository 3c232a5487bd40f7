"""What hrt_model_exec prints: tensor property blocks, infer summaries, a farm's headers, agreement and perf table."""
from typing import List, Sequence

import numpy as np

from bpuemu.common.proto import model_pb2
from bpuemu.common.tensor import layout_name, quanti_type_name, tensor_type_name

RULE = "-" * 69


def _tuple(values) -> str:
    return "(" + "".join(f"{v}," for v in values) + ")"


def tensor_block(kind: str, index: int, p: model_pb2.TensorProperties) -> List[str]:
    lines = [f"{kind}[{index}]: ", f"name: {p.name}"]
    if kind == "input":
        lines.append(f"input source: {model_pb2.InputSource.Name(p.input_source)}")
    lines += [
        f"valid shape: {_tuple(p.valid_shape)}",
        f"aligned shape: {_tuple(p.aligned_shape)}",
        f"aligned byte size: {p.aligned_byte_size}",
        f"tensor type: {tensor_type_name(p.tensor_type)}",
        f"tensor layout: {layout_name(p.tensor_layout)}",
        f"quanti type: {quanti_type_name(p.quanti_type)}",
        f"stride: {_tuple(p.stride)}",
    ]
    lines.append("scale data: " + "".join(f"{s:g}," for s in p.scale_data))
    if p.quanti_type != model_pb2.NONE:
        lines.append("zero point data: " + "".join(f"{z}," for z in p.zero_point_data))
    lines.append(f"quantizeAxis: {p.quantize_axis}")
    return lines


def model_info_text(models: Sequence[model_pb2.Model], where: str, load_ms: float) -> str:
    out = [f"Load model on {where} cost {load_ms:.3f}ms.",
           f"This model file has {len(models)} model:"]
    out += [f"[{m.name}]" for m in models]
    for m in models:
        out += [RULE, f"[model name]: {m.name}", ""]
        for i, p in enumerate(m.inputs):
            out += tensor_block("input", i, p) + [""]
        for i, p in enumerate(m.outputs):
            out += tensor_block("output", i, p) + [""]
    out.append(RULE)
    return "\n".join(out)


def _score(value) -> str:
    """A top-k value as the output holds it: an integer output's (int8, int16, ArgMax) as an integer."""
    return str(int(value)) if np.issubdtype(np.asarray(value).dtype, np.integer) else f"{float(value):.6f}"


def infer_text(model_name: str, outputs: dict, latencies: Sequence[float], top_k: int = 5) -> str:
    out = [f"infer success: model {model_name}"]
    for i, (name, arr) in enumerate(outputs.items()):
        arr = np.asarray(arr)
        line = f"output[{i}]: name: {name}, shape: {list(arr.shape)}, dtype: {arr.dtype.name}"
        if arr.size:
            line += f", min: {arr.min():.6g}, max: {arr.max():.6g}"
        out.append(line)
        flat = arr.reshape(-1)
        if arr.ndim >= 2 and arr.shape[0] == 1 and flat.size == max(arr.shape) and flat.size > 1:
            top = np.argsort(-flat.astype(np.float64), kind="stable")[:top_k]
            out.append("  top%d: %s" % (len(top), ", ".join(f"{int(k)}:{_score(flat[k])}" for k in top)))
    n = len(latencies)
    out.append(f"frame count: {n}, Average latency is: {sum(latencies) / max(n, 1):.6f} ms")
    return "\n".join(out)


def board_header(backend) -> str:
    """The line above one board's result when several boards answer: ``=== board HOST:PORT (arch, bpuemu V) ===``."""
    return f"=== {backend.description} ==="


def agreement_text(agreement) -> str:
    """Whether the boards' infer outputs agree bit for bit (an Agreement, bpuemu.board.backends)."""
    if agreement.differ:
        return f"outputs differ from board {agreement.reference} on: {', '.join(agreement.differ)}"
    if agreement.answered == agreement.boards:
        return f"outputs identical on all {agreement.answered} boards"
    return f"outputs identical on the {agreement.answered} boards that answered"


def farm_perf_text(run) -> str:
    """The board farm's perf table: one row per board (or its failure), then all boards together.

    ``run``: a PerfRun (bpuemu.board.backends), its ``summary`` the aggregate.
    """
    outcomes, summary = run.outcomes, run.summary
    width = max([len(o.target) for o in outcomes] + [len("all boards")])
    head = f"{'board':<{width}}  {'frames':>8}  {'FPS':>12}  {'avg ms':>10}  {'p50 ms':>10}  {'p90 ms':>10}  {'p99 ms':>10}"
    failed = summary.boards - summary.succeeded
    out = [f"Board farm perf: {summary.boards} boards, {summary.succeeded} succeeded, {failed} failed", head, "-" * len(head)]
    for o in outcomes:
        if o.ok:
            r = o.value.report
            out.append(f"{o.target:<{width}}  {r.frame_count:>8}  {r.fps:>12.3f}  {r.average_latency_ms:>10.3f}  "
                       f"{r.p50_ms:>10.3f}  {r.p90_ms:>10.3f}  {r.p99_ms:>10.3f}")
        else:
            out.append(f"{o.target:<{width}}  {'FAILED':>8}  {o.error.message.splitlines()[0]}")
    out.append("-" * len(head))
    s = summary
    out.append(f"{'all boards':<{width}}  {s.frame_count:>8}  {s.fps:>12.3f}  {s.average_latency_ms:>10.3f}  "
               f"{s.worst_p50_ms:>10.3f}  {s.worst_p90_ms:>10.3f}  {s.worst_p99_ms:>10.3f}")
    out.append("(all boards: frames and FPS summed over the boards that succeeded, average latency weighted by "
               "frames, p50/p90/p99 the worst board's)")
    return "\n".join(out)
