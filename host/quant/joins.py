"""Model outputs that join tensors of very different ranges under one quantization scale.

One cosine over a whole output can hide a broken part (DESIGN.md, "real-model
quantization pitfalls"): a detector output that concatenates box coordinates in
pixels (hundreds) with 0-1 class scores under one int8 scale has a step of
several units, so every score rounds to one or two values while the output's
cosine stays at 0.999.

``check_joins`` finds every model output fed by a Concat (through
shape-only ops: Reshape, Transpose, Flatten, ...), measures each joined part's
float range, and compares the quantized model with the float model *per part*:
cosine and the number of distinct quantized values. A join whose parts' ranges
differ by more than ``RANGE_RATIO`` and that is quantized with one int8 scale
gets a WARNING naming the node, the ranges and the seed's remedies (that node
in int16 or on the CPU through node_info / run_on_cpu, or int16 model outputs).

Both models must carry the same node names (the float model makertbin
quantized, or a calibrated model's float and fake-quantized variants).
"""
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import onnx

from bpuemu.common.compare import cosine_similarity
from bpuemu.host.onnxgraph import DQ, Q, GraphIndex, attr, feed_for, open_session, with_outputs

#: Parts whose float ranges differ by more than this share one scale badly (int8: 127 steps).
RANGE_RATIO = 20.0
JOIN_OPS = frozenset({"Concat"})
#: Ops between the join and the model output that only move values around.
SHAPE_OPS = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


@dataclass
class Part:
    tensor: str
    float_range: float = 0.0        # largest |x| over the samples
    cosine: float = 1.0             # per part, quantized vs float, averaged over samples
    distinct: int = 0               # distinct quantized values over the samples


@dataclass
class JoinFinding:
    output: str
    node: str
    axis: int
    dtype: Optional[str]            # quantization of the joined tensor: int8, int16, or None (float, on the CPU)
    parts: List[Part] = field(default_factory=list)
    #: the join and the shape-only ops after it, up to the output (what must leave the BPU together)
    chain: List[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        ranges = [p.float_range for p in self.parts if p.float_range > 0]
        return max(ranges) / min(ranges) if len(ranges) > 1 else 1.0

    @property
    def collapsed(self) -> bool:
        """Ranges too far apart for the one int8 scale the parts share."""
        return self.dtype == "int8" and self.ratio > RANGE_RATIO

    def report_lines(self) -> List[str]:
        q = self.dtype or "float (not quantized)"
        lines = [f"output {self.output} joins {len(self.parts)} parts at {self.node} (axis {self.axis}, {q}):"]
        for i, p in enumerate(self.parts):
            lines.append(f"  part {i} ({p.tensor}): range +-{p.float_range:.6g}, cosine {p.cosine:.6f}, "
                         f"{p.distinct} distinct quantized value(s)")
        return lines

    def remedy(self) -> str:
        """The seed's remedies, as yaml values a user can paste."""
        chain = self.chain or [self.node]
        cpu = ", ".join(f"{n}: {{'ON': 'CPU'}}" for n in chain)
        return (f"compute {self.node} in int16 (node_info: {{{self.node}: {{'InputType': 'int16', 'OutputType': 'int16'}}}}), "
                f"or in float on the CPU together with the shape ops after it (node_info: {{{cpu}}} / "
                f"run_on_cpu: '{'; '.join(chain)}'), or set optimization: set_model_output_int16")

    def warning(self) -> str:
        ranges = ", ".join(f"{p.tensor} +-{p.float_range:.4g}" for p in self.parts)
        worst = min(self.parts, key=lambda p: p.cosine)
        return (f"output {self.output}: {self.node} joins parts whose ranges differ {self.ratio:.0f}x ({ranges}) under one "
                f"int8 scale; part {worst.tensor} keeps {worst.distinct} distinct value(s), cosine {worst.cosine:.4f} "
                f"although the whole output looks fine. Remedy: {self.remedy()}")


def _join_behind(idx: GraphIndex, output: str):
    """(join node, [join, shape ops ... up to the output]) or (None, [])."""
    t = output
    chain: List[str] = []
    while t in idx.producer and len(chain) < len(idx.nodes):
        n = idx.producer[t]
        chain.insert(0, n.name)
        if n.op_type in JOIN_OPS:
            return n, chain
        if n.op_type not in SHAPE_OPS:
            return None, []
        t = n.input[0]
    return None, []


def _quantized_view(qidx: GraphIndex, tensor: str):
    """(tensor holding the dequantized value, dtype) of ``tensor`` in the quantized model."""
    q = next((c for c, _ in qidx.consumers.get(tensor, []) if c.op_type == Q), None)
    if q is None:
        return tensor, None
    dq = next((c for c, _ in qidx.consumers.get(q.output[0], []) if c.op_type == DQ), None)
    zp = qidx.const(q.input[2]) if len(q.input) > 2 and q.input[2] in qidx.inits else np.zeros((), np.uint8)
    dtype = np.dtype(zp.dtype).name
    dtype = {"uint8": "int8", "uint16": "int16"}.get(dtype, dtype)
    return (dq.output[0] if dq is not None else q.output[0]), dtype


def joins_at_outputs(float_model: onnx.ModelProto) -> Dict[str, tuple]:
    """model output -> (the join node feeding it, the chain of nodes from it to the output)."""
    idx = GraphIndex(float_model)
    found = {}
    for o in idx.outputs:
        n, chain = _join_behind(idx, o)
        if n is not None and len([i for i in n.input if i]) > 1:
            # Identity nodes are a calibrated model's bypassed calibration nodes, not model nodes.
            found[o] = (n, [c for c in chain if idx.by_name[c].op_type != "Identity"])
    return found


def check_joins(float_model: onnx.ModelProto, quantized_model: onnx.ModelProto,
                samples: Sequence[Mapping[str, np.ndarray]]) -> List[JoinFinding]:
    """Per-part figures for every model output fed by a join (see the module docstring)."""
    joins = joins_at_outputs(float_model)
    if not joins or not samples:
        return []
    qidx = GraphIndex(quantized_model)
    findings, f_names, q_names = [], [], []
    for out, (node, chain) in joins.items():
        qnode = qidx.by_name.get(node.name)
        if qnode is None:
            continue
        q_tensor, dtype = _quantized_view(qidx, qnode.output[0])
        f = JoinFinding(out, node.name, int(attr(node, "axis", 0)), dtype, [Part(i) for i in node.input if i], chain)
        findings.append((f, node.output[0], q_tensor))
        f_names += [p.tensor for p in f.parts] + [node.output[0]]
        q_names.append(q_tensor)
    if not findings:
        return []
    f_names, q_names = list(dict.fromkeys(f_names)), list(dict.fromkeys(q_names))
    fs = open_session(with_outputs(float_model, f_names))
    qs = open_session(with_outputs(quantized_model, q_names))
    sums: Dict[tuple, float] = {}
    values: Dict[tuple, List[np.ndarray]] = {}
    for s in samples:
        fv = dict(zip(f_names, fs.run(f_names, feed_for(fs, s))))
        qv = dict(zip(q_names, qs.run(q_names, feed_for(qs, s))))
        for f, f_out, q_out in findings:
            ref, got = fv[f_out], qv[q_out]
            axis = f.axis % ref.ndim
            start = 0
            for k, p in enumerate(f.parts):
                part = fv[p.tensor]
                p.float_range = max(p.float_range, float(np.max(np.abs(part), initial=0.0)))
                end = start + part.shape[axis]
                sl = [slice(None)] * ref.ndim
                sl[axis] = slice(start, end)
                key = (f.node, k)
                sums[key] = sums.get(key, 0.0) + cosine_similarity(ref[tuple(sl)], got[tuple(sl)])
                values.setdefault(key, []).append(np.unique(got[tuple(sl)]))
                start = end
    for f, _, _ in findings:
        for k, p in enumerate(f.parts):
            p.cosine = sums[(f.node, k)] / len(samples)
            p.distinct = int(np.unique(np.concatenate(values[(f.node, k)])).size)
    return [f for f, _, _ in findings]
