"""Lookup-table fusion across a plan: an elementwise function of one int8 tensor is one table on the X5.

Between BPU layers every tensor is int8, so any chain of elementwise operators whose only
non-constant input is one such tensor ``x`` computes some f(x) of 256 possible inputs: the X5's
compiler evaluates f once per input value and runs the chain as one lookup-table pass (HzLut)
over the output. That is what becomes of an exported GELU (Div by sqrt 2, Erf, Add 1, Mul by x,
Mul by 0.5; the tanh form: Pow, Mul, Add, Tanh, ...), SiLU (x * Sigmoid(x)), a decomposed
HardSwish (x * HardSigmoid(x)) or Mish. bpuemu's plan keeps the chain's operators (some of them on
its CPU, GELU's Div and Erf), so the timing model would cost 4-5 passes over the tensor, a table
lookup each at the lookup rate, where the board makes one.

``lut_groups`` reads the pieces of a whole plan (tensors connect across steps by name, through
QuantizeLinear / DequantizeLinear) and returns the groups: the operators costed inside a table
(``fused``) and the ones that are a table pass (``tables``: the group's operators whose output
leaves the group). A lone elementwise operator is left as it is (a Sigmoid stays a table, an Add of
a constant a vector op, a Relu fused into its conv). A binary operator of two different tensors
(the squeeze-excitation's broadcast Mul, a residual Add) is not a function of one tensor and is
never in a group; nor is an operator whose output has more elements than its input (a broadcast).
"""
from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Sequence

import numpy as np
import onnx

from bpuemu.host.compiler.plan import piece_tensors, value_shape
from bpuemu.host.onnxgraph import DQ, Q

#: Elementwise operators: one output element from the same element of each input.
ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Erf", "Gelu",
    "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Softplus", "Elu", "LeakyRelu", "Relu", "Clip", "Max", "Min",
})


@dataclass(frozen=True)
class Fusion:
    """Operators (node names) of the plan's lookup-table groups."""

    fused: FrozenSet[str] = frozenset()     # costed inside their group's table
    tables: FrozenSet[str] = frozenset()    # one lookup-table pass over their output each

    def role(self, node_name: str) -> str:
        return "fused" if node_name in self.fused else "table" if node_name in self.tables else ""


NO_FUSION = Fusion()


def _elements(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape and all(d > 0 for d in shape) else -1


def lut_groups(pieces: Sequence[onnx.ModelProto]) -> Fusion:
    """The lookup-table groups of a plan whose compute pieces (BPU subgraphs and CPU ops) are ``pieces``, in order."""
    producer: Dict[str, onnx.NodeProto] = {}
    consts, elements = set(), {}
    nodes: List[onnx.NodeProto] = []
    for piece in pieces:
        consts.update(t.name for t in piece.graph.initializer)
        for name, vi in piece_tensors(piece).items():
            elements.setdefault(name, _elements(value_shape(vi)))
        for n in piece.graph.node:
            if n.op_type == "Constant":
                consts.update(n.output)
                continue
            for o in n.output:
                producer[o] = n
            if n.op_type not in (Q, DQ):
                nodes.append(n)

    def real(t: str) -> str:
        """The tensor behind any QuantizeLinear / DequantizeLinear (one name for a tensor and its int8 form)."""
        seen = 0
        while t in producer and producer[t].op_type in (Q, DQ) and seen < 8:
            t, seen = producer[t].input[0], seen + 1
        return t

    root: Dict[str, str] = {}                # tensor -> the one tensor it is an elementwise function of
    group_of: Dict[str, str] = {}            # node name -> its group's root
    members = defaultdict(list)
    for n in nodes:
        if n.op_type not in ELEMENTWISE or not n.output:
            continue
        ins = [real(i) for i in n.input if i and real(i) not in consts]
        roots = {root.get(i, i) for i in ins}
        if len(roots) != 1:
            continue
        r = roots.pop()
        out = real(n.output[0])
        size = elements.get(out, elements.get(n.output[0], -1))
        if size < 0 or size != elements.get(r, -1):
            continue
        root[out] = r
        group_of[n.name] = r
        members[r].append(n)

    readers = defaultdict(set)
    for n in nodes:
        for i in n.input:
            if i:
                readers[real(i)].add(n.name)
    fused, tables = set(), set()
    for r, group in members.items():
        if len(group) < 2:
            continue
        names = {n.name for n in group}
        for n in group:
            outside = readers[real(n.output[0])] - names
            if outside or not readers[real(n.output[0])]:
                tables.add(n.name)
            else:
                fused.add(n.name)
    return Fusion(frozenset(fused), frozenset(tables))
