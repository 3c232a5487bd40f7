"""BPU/CPU placement of a float model's nodes: the checker's table, makertbin's plan.

For each node: where it runs (BPU or CPU), its BPU type name (from the op
table), its subgraph id, and -- for every CPU node -- why. Rules, in order:

1. Not in the X5 BPU op table, or a table constraint is violated -> CPU.
2. Softmax runs on the CPU by default (optimization set_Softmax_input_int8
   moves it to the BPU).
3. Passive ops (Relu, Reshape, Concat, ...) follow their inputs: on the BPU
   only when every activation input comes from a BPU node or a quantized model
   input (repeated until nothing changes).
4. At the model tail only Conv may output int32; a passive op (ReLU, Clip,
   ...) whose output is a model output and whose input is a Conv's output runs
   on the CPU so the Conv keeps its high-precision output (ptq_faq_x5 6.6.1.3).
5. node_info / run_on_cpu / run_on_bpu override all of the above.

Consecutive BPU nodes (in topological order) between CPU nodes form one
subgraph: id(0), id(1), ...
"""
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set

import onnx

from bpuemu.host.optable import BPU_OPS, check_constraints


@dataclass
class NodePlacement:
    name: str
    op_type: str
    on: str                  # "BPU" | "CPU"
    bpu_type: str            # BPU type name, or the op type for CPU nodes
    subgraph: Optional[int] = None
    reason: str = ""         # why a node runs on the CPU


@dataclass
class Placement:
    nodes: List[NodePlacement] = field(default_factory=list)

    def by_name(self) -> Dict[str, NodePlacement]:
        return {n.name: n for n in self.nodes}

    @property
    def bpu_nodes(self) -> Set[str]:
        return {n.name for n in self.nodes if n.on == "BPU"}

    @property
    def cpu_nodes(self) -> Set[str]:
        return {n.name for n in self.nodes if n.on == "CPU"}

    @property
    def subgraph_count(self) -> int:
        ids = {n.subgraph for n in self.nodes if n.subgraph is not None}
        return len(ids)

    def table(self, extra_columns: Optional[Dict[str, List[str]]] = None) -> str:
        """The checker/makertbin table: Node ON Subgraph Type [extra columns]."""
        extra_columns = extra_columns or {}
        headers = ["Node", "ON", "Subgraph", "Type"] + list(extra_columns)
        rows = []
        for i, n in enumerate(self.nodes):
            sub = f"id({n.subgraph})" if n.subgraph is not None else "--"
            rows.append([n.name, n.on, sub, n.bpu_type] + [col[i] for col in extra_columns.values()])
        widths = [max(len(h), *(len(r[j]) for r in rows)) if rows else len(h) for j, h in enumerate(headers)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        total = sum(widths) + 2 * (len(widths) - 1)
        out = ["=" * total, line(headers), "-" * total]
        out += [line(r) for r in rows]
        return "\n".join(out)

    def cpu_reasons(self) -> List[str]:
        return [f"{n.name} ({n.op_type}) runs on CPU: {n.reason}" for n in self.nodes if n.on == "CPU" and n.reason]


def place(
    model: onnx.ModelProto,
    quantized_inputs: Iterable[str] = (),
    force_cpu: Iterable[str] = (),
    force_bpu: Iterable[str] = (),
    softmax_on_bpu: bool = False,
) -> Placement:
    """Place every node of ``model`` (a float model, optimized or not)."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    consts = {n.output[0] for n in g.node if n.op_type == "Constant"}
    outputs = {o.name for o in g.output}
    quantized_inputs = set(quantized_inputs)
    force_cpu, force_bpu = set(force_cpu), set(force_bpu)
    producer = {o: n for n in g.node for o in n.output if o}
    nodes = [n for n in g.node if n.op_type != "Constant"]
    for i, n in enumerate(nodes):
        if not n.name:
            n.name = f"{n.op_type}_{i}"

    result: Dict[str, NodePlacement] = {}
    for n in nodes:
        op = BPU_OPS.get(n.op_type)
        if op is None:
            result[n.name] = NodePlacement(n.name, n.op_type, "CPU", n.op_type, reason="not supported by the BPU")
            continue
        violated = check_constraints(n, model)
        if violated:
            result[n.name] = NodePlacement(n.name, n.op_type, "CPU", n.op_type, reason=f"BPU constraint violated: {violated}")
        elif op.cpu_by_default and not softmax_on_bpu:
            result[n.name] = NodePlacement(n.name, n.op_type, "CPU", n.op_type,
                                           reason="Softmax runs on CPU by default (optimization: set_Softmax_input_int8 moves it)")
        else:
            result[n.name] = NodePlacement(n.name, n.op_type, "BPU", op.bpu_type)

    def activation_inputs(n):
        return [i for i in n.input if i and i not in inits and i not in consts]

    def input_on_bpu(t: str) -> bool:
        if t in quantized_inputs:
            return True
        p = producer.get(t)
        return p is not None and p.name in result and result[p.name].on == "BPU"

    changed = True
    while changed:
        changed = False
        for n in nodes:
            p = result[n.name]
            if p.on != "BPU" or BPU_OPS[n.op_type].active:
                continue
            if not all(input_on_bpu(t) for t in activation_inputs(n)):
                p.on, p.bpu_type = "CPU", n.op_type
                p.reason = "passive quantization: runs on the BPU only between BPU ops, and an input comes from the CPU"
                changed = True
        # tail rule
        for n in nodes:
            p = result[n.name]
            if p.on != "BPU" or BPU_OPS[n.op_type].active:
                continue
            if any(o in outputs for o in n.output):
                srcs = [producer.get(t) for t in activation_inputs(n)]
                if any(s is not None and s.op_type in ("Conv", "Gemm") for s in srcs):
                    p.on, p.bpu_type = "CPU", n.op_type
                    p.reason = "at the model tail after a Conv that outputs int32 for precision (run_on_bpu to override)"
                    changed = True

    for n in nodes:
        p = result[n.name]
        if n.name in force_cpu:
            p.on, p.bpu_type, p.reason = "CPU", n.op_type, "run_on_cpu / node_info ON: CPU"
        elif n.name in force_bpu and n.op_type in BPU_OPS:
            p.on, p.bpu_type, p.reason = "BPU", BPU_OPS[n.op_type].bpu_type, ""

    sub, in_run = -1, False
    ordered = []
    for n in nodes:
        p = result[n.name]
        if p.on == "BPU":
            if not in_run:
                sub += 1
                in_run = True
            p.subgraph = sub
        else:
            in_run = False
        ordered.append(p)
    return Placement(ordered)
