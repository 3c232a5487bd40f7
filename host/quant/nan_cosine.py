"""Why a node's Calibrated Cosine is nan (ptq_faq_j6, "what are the several scenarios in which the
Calibrated Cosine column appears as nan").

The FAQ's two causes, as bpuemu finds them after calibration:

1. infinite values: a Where whose second input is -Inf puts -Inf into the float tensor (the real
   toolchain splits Where into quantizable ops, which cannot hold it); any node whose float output
   holds Inf gets a nan cosine, since the cosine of infinite vectors is undefined;
2. an all-zero tensor a BPU node reads (an activation, or a constant such as the optimizer's folding
   of a Concat of all-0 constants and a Slice): its calibration threshold is 0, which is illegal,
   and on the J6 flow the node's Calibrated Cosine is nan. Two origins are named: a Concat of all-0
   constants (then a Slice), and a Cast of an Equal that is false everywhere (Cast+Equal on a bool).

``nan_cosine_notes`` returns node -> the reason, tracing the all-zero tensor back through the
original float model to name its origin; the conversion goes on either way.
"""
from typing import Dict, Mapping, Optional

import numpy as np
import onnx
from onnx import numpy_helper

from bpuemu.host.onnxgraph import GraphIndex, attr
from bpuemu.host.quant.params import MIN_THRESHOLD

#: Ops whose constant inputs the toolchain calibrates like featuremaps (a weight or a bias is not one).
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Concat"})
#: How many producers back the origin of an all-zero tensor is looked for.
_ORIGIN_DEPTH = 4


def _constant(idx: GraphIndex, tensor: str) -> Optional[np.ndarray]:
    """The value of ``tensor`` when an initializer, a Constant or a ConstantOfShape makes it."""
    if tensor in idx.inits:
        return idx.const(tensor)
    p = idx.producer.get(tensor)
    if p is None:
        return None
    if p.op_type == "Constant":
        value = attr(p, "value")
        return numpy_helper.to_array(value) if value is not None else None
    if p.op_type == "ConstantOfShape":
        value = attr(p, "value")
        return numpy_helper.to_array(value) if value is not None else np.zeros(1, np.float32)
    return None


def _is_zero(value: Optional[np.ndarray]) -> bool:
    return value is not None and value.size > 0 and not np.any(value)


def zero_origin(original: onnx.ModelProto, tensor: str) -> str:
    """The FAQ's origin of the all-zero ``tensor`` in the original float model, or ""."""
    idx = GraphIndex(original)
    frontier = [tensor]
    for _ in range(_ORIGIN_DEPTH):
        nxt = []
        for t in frontier:
            p = idx.producer.get(t)
            if p is None:
                continue
            if p.op_type == "Concat" and all(_is_zero(_constant(idx, i)) for i in p.input if i):
                return f"a Concat of all-0 constants ({p.name}) and the Slice after it"
            if p.op_type == "Equal":
                return f"a Cast of the Equal {p.name}, which is false on every calibration sample (Cast+Equal)"
            nxt.extend(i for i in p.input if i)
        frontier = nxt
    return ""


def _zero_input(plan, params, idx: GraphIndex, node: onnx.NodeProto) -> str:
    """The input of BPU ``node`` that is all zeros (a threshold of 0), or ""."""
    for t in node.input:
        if not t:
            continue
        q = params.activations.get(t)
        if q is not None and t in plan.activations and not plan.group_of(t).fixed:
            if q.max_threshold <= MIN_THRESHOLD * 1.0001:
                return t
        elif node.op_type in ELEMENTWISE and t in idx.inits and idx.inits[t].data_type == onnx.TensorProto.FLOAT \
                and _is_zero(idx.const(t)):
            return t
    return ""


def nan_cosine_notes(placement, params, original: onnx.ModelProto, cosines: Mapping[str, float]) -> Dict[str, str]:
    """Node -> why its Calibrated Cosine is nan, for the nodes whose cosine is nan or whose input has a
    threshold of 0 (see the module docstring)."""
    plan = params.plan
    idx = GraphIndex(plan.model)
    notes: Dict[str, str] = {}
    for p in placement.nodes:
        node = idx.by_name.get(p.name)
        if node is None:
            continue
        if p.name in cosines and np.isnan(cosines[p.name]):
            neg_inf = [i for i in node.input if i and (c := _constant(idx, i)) is not None and np.any(np.isinf(c))]
            if node.op_type == "Where" and neg_inf:
                notes[p.name] = (f"its input {neg_inf[0]} is -Inf (a Where whose second input is -Inf): its output "
                                 "holds -Inf, which quantization cannot represent, and the cosine of infinite "
                                 "values is nan")
            else:
                notes[p.name] = "its float output holds Inf or NaN values, whose cosine is nan"
            continue
        if p.on != "BPU":
            continue
        zero = _zero_input(plan, params, idx, node)
        if zero:
            origin = zero_origin(original, zero)
            notes[p.name] = (f"its input {zero} is all zeros on every calibration sample"
                             + (f" ({origin})" if origin else "")
                             + ", so its calibration threshold is 0, which is illegal")
    return notes


__all__ = ["nan_cosine_notes", "zero_origin"]
