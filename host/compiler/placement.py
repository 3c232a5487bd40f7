"""BPU/CPU placement of a float model's nodes: the checker's table, makertbin's plan.

For each node: where it runs (BPU or CPU), its BPU type name (from the op
table), its subgraph id, and -- for every CPU node -- why. Rules, in order:

1. Not in the X5 BPU op table, or a table constraint is violated -> CPU.
2. Softmax runs on the CPU by default (optimization set_Softmax_input_int8
   moves it to the BPU).
3. Passive ops (Relu, Reshape, Concat, ...) follow their inputs: on the BPU
   only when every activation input comes from a BPU node or a quantized model
   input (repeated until nothing changes).
4. At the model tail only Conv may output int32 (``int32_output`` in the op
   table); a passive op (ReLU, Clip, ...) whose output is a model output and
   whose input is such an op's output runs on the CPU so the Conv keeps its
   high-precision output (ptq_faq_x5 6.6.1.3).
5. node_info / run_on_cpu / run_on_bpu override all of the above.

On a J6 march (``March.is_j6``) rules 2 and 4 read the precision the
quant_config gives each node (``qtypes``: node -> its qtype and where it was
configured) and ptq_faq_j6's int32 cases:

* a node configured to a qtype the march's BPU lacks (float32; float16 on
  nash-e/m) runs on the CPU; a qtype configured per op type or per node that
  the BPU has moves a node the tail rule or the Softmax default would put on
  the CPU onto the BPU (the FAQ's "force them onto BPU");
* the tail Conv is a Conv (or Gemm) after which no MAC op (Conv,
  ConvTranspose, Gemm, MatMul) runs on the BPU; the tail rule covers every
  BPU op after it, active ones too (ReLU, Add), and the tail Conv itself
  outputs ``March.tail_output_dtype`` (int32 on nash-e/m, float32 on
  nash-b/h/p) when no BPU op reads it;
* a node whose inputs are already integers in the model (an int32 Mul) runs
  on the BPU without quantization;
* ArgMax outputs int64 (ONNX), which the BPU does not: it runs on the CPU
  unless a Cast to int8/int16/int32 follows it, which then runs with it on the
  BPU.

Each node also gets its ``output_dtype`` (the type the node table's "Output
Data Type" shows; quantization refines it, bpuemu.host.quant.precision) and,
when a configured qtype does not take effect, ``qtype_note`` saying why.

Consecutive BPU nodes (in topological order) between CPU nodes form one
subgraph: id(0), id(1), ...
"""
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple

import onnx

from bpuemu.common.march import March
from bpuemu.host.compiler.optable import BPU_OPS, check_constraints
from bpuemu.host.onnxgraph import GraphIndex


@dataclass
class NodePlacement:
    name: str
    op_type: str
    on: str                  # "BPU" | "CPU"
    bpu_type: str            # BPU type name, or the op type for CPU nodes
    subgraph: Optional[int] = None
    reason: str = ""         # why a node runs on the CPU
    #: The node's output data type ("int8", "int16", "int32", "float32", ...); "" when not resolved (X5 flow).
    output_dtype: str = ""
    #: Why a qtype the quant_config gives this node does not take effect ("" when it does or none is given).
    qtype_note: str = ""
    #: Why the node's Calibrated Cosine is nan ("" when it is a number).
    cosine_note: str = ""
    #: A BPU node whose output leaves the model unquantized (the J6 tail Conv: int32 / float32).
    high_precision: bool = False


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

    @property
    def high_precision_nodes(self) -> Set[str]:
        """BPU nodes whose output leaves the model unquantized (the J6 tail Conv's int32/float32)."""
        return {n.name for n in self.nodes if n.on == "BPU" and n.high_precision}


def place(
    model: onnx.ModelProto,
    quantized_inputs: Iterable[str] = (),
    force_cpu: Iterable[str] = (),
    force_bpu: Iterable[str] = (),
    softmax_on_bpu: bool = False,
    march: Optional[March] = None,
    qtypes: Optional[Mapping[str, Tuple[str, str]]] = None,
) -> Placement:
    """Place every node of ``model`` (a float model, optimized or not); ``model`` is not changed.

    An unnamed node is placed as ``<op_type>_<index>`` (its index among the
    non-Constant nodes). ``march``: the J6 rules apply on a J6 march (None: the
    X5's); ``qtypes``: node -> (qtype, where configured), from the quant_config.
    """
    g = model.graph
    nodes = [n for n in g.node if n.op_type != "Constant"]
    names = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(nodes)]
    result = {name: _initial(name, n, model, softmax_on_bpu) for name, n in zip(names, nodes)}
    if march is not None and march.is_j6:
        from bpuemu.host.compiler.j6rules import place_j6

        place_j6(model, nodes, names, result, set(quantized_inputs), march, qtypes or {}, _follow_passive)
    else:
        _follow_passive(model, nodes, names, result, set(quantized_inputs))
    _apply_overrides(nodes, names, result, set(force_cpu), set(force_bpu))
    return Placement(_number_subgraphs([result[name] for name in names]))


def _initial(name: str, n: onnx.NodeProto, model: onnx.ModelProto, softmax_on_bpu: bool) -> NodePlacement:
    """Rules 1 and 2: the op table and its constraints; Softmax on the CPU by default."""
    op = BPU_OPS.get(n.op_type)
    if op is None:
        return NodePlacement(name, n.op_type, "CPU", n.op_type, reason="not supported by the BPU")
    violated = check_constraints(n, model)
    if violated:
        return NodePlacement(name, n.op_type, "CPU", n.op_type, reason=f"BPU constraint violated: {violated}")
    if op.cpu_by_default and not softmax_on_bpu:
        return NodePlacement(name, n.op_type, "CPU", n.op_type,
                             reason="Softmax runs on CPU by default (optimization: set_Softmax_input_int8 moves it)")
    return NodePlacement(name, n.op_type, "BPU", op.bpu_type)


def _follow_passive(model, nodes, names, result: Dict[str, NodePlacement], quantized_inputs: Set[str],
                    tail_rule: bool = True) -> None:
    """Rules 3 and 4, repeated until nothing changes: passive ops follow their
    inputs, and (``tail_rule``) a passive op at the model tail after an int32-output op runs on the CPU."""
    idx = GraphIndex(model)
    constants = set(idx.inits) | {t for t, n in idx.producer.items() if n.op_type == "Constant"}
    outputs = set(idx.outputs)
    placed_name = {id(n): name for name, n in zip(names, nodes)}

    def producer(t: str) -> Optional[NodePlacement]:
        """The placement of the node making ``t`` (None for a model input or a constant)."""
        n = idx.producer.get(t)
        return result[placed_name[id(n)]] if n is not None and id(n) in placed_name else None

    def activation_inputs(n):
        return [i for i in n.input if i and i not in constants]

    def input_on_bpu(t: str) -> bool:
        p = producer(t)
        return t in quantized_inputs or (p is not None and p.on == "BPU")

    def after_int32_output(n) -> bool:
        srcs = [p.op_type for p in map(producer, activation_inputs(n)) if p is not None]
        return any(BPU_OPS[op].int32_output for op in srcs if op in BPU_OPS)

    passive = [(name, n) for name, n in zip(names, nodes) if n.op_type in BPU_OPS and not BPU_OPS[n.op_type].active]
    changed = True
    while changed:
        changed = False
        for name, n in passive:
            p = result[name]
            if p.on == "BPU" and not all(input_on_bpu(t) for t in activation_inputs(n)):
                p.on, p.bpu_type = "CPU", n.op_type
                p.reason = "passive quantization: runs on the BPU only between BPU ops, and an input comes from the CPU"
                changed = True
        for name, n in passive if tail_rule else ():
            p = result[name]
            if p.on == "BPU" and any(o in outputs for o in n.output) and after_int32_output(n):
                p.on, p.bpu_type = "CPU", n.op_type
                p.reason = "at the model tail after a Conv that outputs int32 for precision (run_on_bpu to override)"
                changed = True


def _apply_overrides(nodes, names, result: Dict[str, NodePlacement], force_cpu: Set[str], force_bpu: Set[str]) -> None:
    """Rule 5: node_info / run_on_cpu / run_on_bpu win."""
    for name, n in zip(names, nodes):
        p = result[name]
        if name in force_cpu:
            p.on, p.bpu_type, p.reason = "CPU", n.op_type, "run_on_cpu / node_info ON: CPU"
        elif name in force_bpu and n.op_type in BPU_OPS:
            p.on, p.bpu_type, p.reason = "BPU", BPU_OPS[n.op_type].bpu_type, ""


def _number_subgraphs(ordered: List[NodePlacement]) -> List[NodePlacement]:
    """Consecutive BPU nodes form one subgraph: id(0), id(1), ..."""
    sub, in_run = -1, False
    for p in ordered:
        if p.on == "BPU":
            if not in_run:
                sub += 1
                in_run = True
            p.subgraph = sub
        else:
            in_run = False
    return ordered
