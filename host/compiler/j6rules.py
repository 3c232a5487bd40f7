"""The J6 placement rules (ptq_faq_j6): quant_config qtypes, the tail Conv's int32/float32 output,
integer inputs and ArgMax's Cast. ``placement.place`` runs them on a J6 march; see its docstring.

Each rule is a small function over the placement in progress (node name ->
``NodePlacement``), run in this order: the configured qtypes, the integer
rules (int32 cases 2 and 3), passive following, the tail rule (a Conv no MAC op follows), passive
following again, then the output data types.
"""
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple

import onnx
from onnx import TensorProto, helper

from bpuemu.common.march import March
from bpuemu.host.compiler.optable import BPU_OPS, check_constraints
from bpuemu.host.onnxgraph import GraphIndex, TensorInfo, elem_type_name, tensor_infos

#: Where a qtype comes from when it is only the model's default (it forces nothing onto the BPU).
MODEL_LEVEL = "model_config"
#: Cast targets the BPU gives ArgMax's indices (ptq_faq_j6 int32 case 3).
ARGMAX_CAST_TYPES = {TensorProto.INT8: "int8", TensorProto.INT16: "int16", TensorProto.INT32: "int32"}
#: Integer types the BPU computes on as they are (int32 case 2).
BPU_INTEGER_TYPES = ("int8", "int16", "int32")
#: Ops the BPU runs directly on inputs that are integers in the model (int32 case 2: "Take Mul as an example").
INTEGER_INPUT_OPS = frozenset({"Mul", "Add", "Sub"})


def dtype_name(info: Optional[TensorInfo]) -> str:
    """"int32", "float32", ... for a tensor's element type ("float32" when unknown)."""
    return elem_type_name(info.elem_type) if info is not None else "float32"


class _Graph:
    """The model seen by node name (placement's names: unnamed nodes are ``<op>_<i>``)."""

    def __init__(self, model: onnx.ModelProto, nodes, names):
        self.idx = GraphIndex(model)
        self.infos = tensor_infos(model)
        self.nodes = list(zip(names, nodes))
        self._name = {id(n): name for name, n in self.nodes}
        self.by_name = {name: n for name, n in self.nodes}
        self.constants = set(self.idx.inits) | {t for t, n in self.idx.producer.items() if n.op_type == "Constant"}
        self.outputs = set(self.idx.outputs)

    def name(self, node: onnx.NodeProto) -> Optional[str]:
        return self._name.get(id(node))

    def producer(self, tensor: str) -> Optional[str]:
        n = self.idx.producer.get(tensor)
        return self.name(n) if n is not None else None

    def readers(self, node: onnx.NodeProto) -> List[Tuple[str, onnx.NodeProto]]:
        return [(self.name(c), c) for o in node.output if o for c, _ in self.idx.consumers.get(o, [])
                if self.name(c) is not None]

    def activations(self, node: onnx.NodeProto) -> List[str]:
        return [i for i in node.input if i and i not in self.constants]

    def is_integer(self, tensor: str) -> bool:
        info = self.infos.get(tensor)
        return info is not None and info.elem_type not in (TensorProto.FLOAT, TensorProto.FLOAT16,
                                                           TensorProto.DOUBLE, TensorProto.BOOL, 0)

    def macs_below(self, result) -> Set[str]:
        """Nodes some BPU MAC op (Conv, ConvTranspose, Gemm, MatMul) comes after, directly or not."""
        out: Set[str] = set()
        for name, n in reversed(self.nodes):
            for rn, _ in self.readers(n):
                if rn in out or _is_mac(result[rn]):
                    out.add(name)
                    break
        return out


def _is_tail_capable(p) -> bool:
    return p.on == "BPU" and p.op_type in BPU_OPS and BPU_OPS[p.op_type].int32_output


def _is_mac(p) -> bool:
    return p.on == "BPU" and p.op_type in BPU_OPS and BPU_OPS[p.op_type].unit == "mac"


def _tail_convs(g: _Graph, result) -> Set[str]:
    """The tail Convs: BPU Convs (ops that may output their accumulator) no BPU MAC op comes after, the
    last quantized compute op of their paths; the vector and passive ops after one fall to the CPU."""
    below = g.macs_below(result)
    return {name for name, _ in g.nodes if _is_tail_capable(result[name]) and name not in below}


def _to_cpu(p, reason: str) -> None:
    p.on, p.bpu_type, p.reason = "CPU", p.op_type, reason


def _configured_qtypes(g: _Graph, result, march: March, qtypes) -> Set[str]:
    """A qtype the BPU lacks runs the node on the CPU; one it has, given per op type or node, forces the
    node onto the BPU where only a default (Softmax) kept it off. Returns the nodes so forced."""
    forced: Set[str] = set()
    bpu_has = ", ".join(q for q in ("int8", "int16", "float16") if q in march.bpu_qtypes)
    for name, n in g.nodes:
        if name not in qtypes:
            continue
        qtype, where = qtypes[name]
        p = result[name]
        if qtype not in march.bpu_qtypes:
            if p.on == "BPU":
                _to_cpu(p, f"quant_config {where} qtype {qtype}: the BPU of {march.name} computes in {bpu_has}; "
                           "runs in float on the CPU")
            if qtype == "float16":
                p.qtype_note = (f"op constraint: {march.name}'s BPU has no float16; the node computes in float32 "
                                "on the CPU")
            continue
        if where == MODEL_LEVEL or n.op_type not in BPU_OPS:
            continue
        forced.add(name)
        if p.on == "CPU" and BPU_OPS[n.op_type].cpu_by_default and not check_constraints(n, g.idx.model):
            p.on, p.bpu_type, p.reason = "BPU", BPU_OPS[n.op_type].bpu_type, ""
    return forced


def _integer_inputs(g: _Graph, result) -> None:
    """int32 case 2: an elementwise op whose inputs are int8/int16/int32 in the model runs on the BPU as it
    is; one on other integers (int64 shape arithmetic) runs on the CPU."""
    for name, n in g.nodes:
        acts = g.activations(n)
        p = result[name]
        if p.on != "BPU" or not acts or not all(g.is_integer(t) for t in acts):
            continue
        types = sorted({dtype_name(g.infos.get(t)) for t in acts})
        if n.op_type in INTEGER_INPUT_OPS and set(types) <= set(BPU_INTEGER_TYPES):
            p.output_dtype = dtype_name(g.infos.get(n.output[0]))
        else:
            _to_cpu(p, f"its inputs are {', '.join(types)} in the model, which the BPU does not compute {n.op_type} on")


def _argmax_cast(g: _Graph, result) -> None:
    """int32 case 3: ArgMax's int64 indices need a Cast to int8/int16/int32 to stay on the BPU."""
    for name, n in g.nodes:
        p = result[name]
        if n.op_type != "ArgMax" or p.on != "BPU":
            continue
        readers = g.readers(n)
        casts = [(rn, r) for rn, r in readers if r.op_type == "Cast"
                 and helper.get_attribute_value(next(a for a in r.attribute if a.name == "to")) in ARGMAX_CAST_TYPES]
        if not readers or len(casts) != len(readers) or n.output[0] in g.outputs:
            _to_cpu(p, "ArgMax outputs int64 (the ONNX specification), which the BPU does not output; "
                       "a Cast to int8, int16 or int32 after it keeps it on the BPU (ptq_faq_j6 int32 case 3)")
            continue
        for rn, r in casts:
            to = helper.get_attribute_value(next(a for a in r.attribute if a.name == "to"))
            cast = result[rn]
            cast.on, cast.bpu_type, cast.reason = "BPU", BPU_OPS["ArgMax"].bpu_type, ""
            cast.output_dtype = p.output_dtype = ARGMAX_CAST_TYPES[to]


def _tail_rule(g: _Graph, result, march: March, forced: Set[str], qtypes) -> None:
    """The tail Conv outputs int32/float32 and cannot fuse, so BPU ops after it run on the CPU."""
    convs = _tail_convs(g, result)
    moved: Dict[str, str] = {}
    for name, n in g.nodes:
        p = result[name]
        if p.on != "BPU" or name in forced or _is_tail_capable(p):
            continue
        srcs = [g.producer(t) for t in g.activations(n)]
        conv = next((s for s in srcs if s in convs), None) or next((moved[s] for s in srcs if s in moved), None)
        if conv is None:
            continue
        moved[name] = conv
        _to_cpu(p, f"tail rule: after the tail Conv {conv}, which outputs {march.tail_output_dtype} for accuracy and "
                   "cannot fuse with it (a quant_config qtype int8/int16 on this node forces it onto the BPU)")
        if name in qtypes:
            p.qtype_note = (f"tail rule: quant_config {qtypes[name][1]} qtype {qtypes[name][0]} does not take effect; "
                            f"the tail Conv {conv} outputs {march.tail_output_dtype}, so this node falls back to the CPU")


def _passive_notes(g: _Graph, result, qtypes) -> None:
    """A qtype configured on a passive op that the passive rule put on the CPU does not take effect."""
    for name, n in g.nodes:
        p = result[name]
        if name in qtypes and p.on == "CPU" and n.op_type in BPU_OPS and not BPU_OPS[n.op_type].active \
                and p.reason.startswith("passive quantization"):
            p.qtype_note = (f"passive quantization: quant_config {qtypes[name][1]} qtype {qtypes[name][0]} does not "
                            f"take effect; {n.op_type} takes the threshold of the ops around it, and an input comes "
                            "from the CPU (a unitconv before/after it gives it a threshold of its own)")


def _cpu_notes(g: _Graph, result, march: March, qtypes) -> None:
    """A BPU qtype configured on a node that runs on the CPU for its op's sake (not supported, a constraint
    violated, Softmax's default) does not take effect: the op's constraint."""
    for name, n in g.nodes:
        p = result[name]
        if name in qtypes and p.on == "CPU" and not p.qtype_note and qtypes[name][0] in march.bpu_qtypes:
            qtype, where = qtypes[name]
            p.qtype_note = (f"op constraint: quant_config {where} qtype {qtype} does not take effect; {n.op_type} "
                            f"runs on the CPU in float32 ({p.reason or 'run_on_cpu'})")


def _output_dtypes(g: _Graph, result, march: March, qtypes) -> None:
    """Each node's output data type as placed: quantization refines BPU int8/int16 (quant.precision)."""
    convs = _tail_convs(g, result)
    for name, n in g.nodes:
        p = result[name]
        if p.output_dtype:
            continue
        out = n.output[0] if n.output else ""
        if g.is_integer(out) or p.on == "CPU":  # a CPU node outputs its tensor's own type (a bool of Equal)
            p.output_dtype = dtype_name(g.infos.get(out))
        elif name in convs and all(result[rn].on == "CPU" for rn, _ in g.readers(n)):
            p.high_precision = True
            p.output_dtype = march.tail_output_dtype
            if name in qtypes:
                p.qtype_note = (f"tail rule: quant_config {qtypes[name][1]} qtype {qtypes[name][0]} does not take "
                                f"effect; the tail Conv outputs {march.tail_output_dtype} on {march.name}")
        else:
            p.output_dtype = "int8"


def place_j6(model: onnx.ModelProto, nodes, names, result, quantized_inputs: Set[str], march: March,
             qtypes: Mapping[str, Tuple[str, str]], follow_passive: Callable) -> None:
    """The J6 rules on ``result`` (node name -> NodePlacement after the op table's rule)."""
    g = _Graph(model, nodes, names)
    forced = _configured_qtypes(g, result, march, qtypes)
    _integer_inputs(g, result)
    _argmax_cast(g, result)
    follow_passive(model, nodes, names, result, quantized_inputs, tail_rule=False)
    _tail_rule(g, result, march, forced, qtypes)
    follow_passive(model, nodes, names, result, quantized_inputs, tail_rule=False)
    _passive_notes(g, result, qtypes)
    _cpu_notes(g, result, march, qtypes)
    _output_dtypes(g, result, march, qtypes)
