"""The layers of a BPU subgraph, read off its ONNX piece: OPs, shapes, DDR bytes.

A piece is a QDQ graph: each compute node reads DequantizeLinear outputs and
feeds QuantizeLinear nodes. On the BPU those are not layers of their own (the
requantization is part of the op), so the tensors the hardware really moves
are looked up *through* them: a layer reads the int8 tensor behind a
DequantizeLinear (its weights are the int8/int32 initializers behind one) and
writes the tensor its QuantizeLinear makes (int8), or its own output where no
QuantizeLinear follows (an int32 tail).

The BPU type name and the unit a layer runs on come from the op table
(bpuemu.host.compiler.optable); the OPs formulas are in ``OPS_FORMULAS``, keyed by ONNX
op type. ``layer_kind`` sorts a layer into the timing model's kinds and ``work`` is
what that kind's rate divides (see bpuemu.host.compiler.timing.x5 for the whole
cost model; the fit, bench/x5_fit.py, reads the same features).
"""
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import numpy_helper

from bpuemu.host.compiler.fuse_preprocess import one_transpose_view
from bpuemu.host.compiler.optable import BPU_OPS
from bpuemu.host.compiler.timing.fusion import NO_FUSION, Fusion
from bpuemu.host.compiler.timing.strategy import DEFAULT_STRATEGY, CompileStrategy
from bpuemu.host.compiler.timing.x5 import KINDS, X5Bpu, align
from bpuemu.host.compiler.plan import attribute, np_dtype, piece_tensors, value_shape
from bpuemu.host.onnxgraph import DQ, Q, GraphIndex

Shape = Tuple[int, ...]


@dataclass
class Layer:
    name: str
    op_type: str
    bpu_type: str
    unit: str
    ops: int
    aligned_ops: int
    output_shape: Shape
    aligned_output_shape: Shape
    loaded_bytes: int = 0
    stored_bytes: int = 0
    weight_bytes: int = 0
    fused_into: str = ""
    kind: str = "vector"          # the timing model's kind (x5.KINDS)
    work: float = 0.0             # what the kind's rate divides: MACs, elements or bytes
    repacked_bytes: float = 0.0
    pixels: int = 1               # the output's H x W (rows of a matrix product, of one head)
    launches: int = 1             # times the layer is started: a MatMul of two activations once per head
    barrier: int = 0              # 1: applies a globally pooled gate to a map (x5.gate_barrier_us)
    compute_us: float = 0.0
    load_store_us: float = 0.0
    latency_us: float = 0.0
    start_us: float = 0.0
    end_us: float = 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["output_shape"] = list(self.output_shape)
        d["aligned_output_shape"] = list(self.aligned_output_shape)
        return d


def _prod(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


# --- OPs formulas ------------------------------------------------------------------

@dataclass
class NodeShapes:
    inputs: List[Shape]
    output: Shape
    weights: Dict[int, np.ndarray] = field(default_factory=dict)   # input index -> constant


#: What a formula returns: the OPs, and for MAC-array ops the (output, input)
#: channel counts whose padding inflates the work (None: the output's padding).
Ops = Tuple[int, Optional[Tuple[int, int]]]


def _conv_ops(node, s: NodeShapes) -> Ops:
    w = s.inputs[1]                      # (Cout, Cin/group, kH, kW)
    cout, cin_g = w[0], w[1]
    macs = _prod(s.output) * cin_g * _prod(w[2:])
    return 2 * macs, (cout, cin_g)


def _conv_transpose_ops(node, s: NodeShapes) -> Ops:
    x, w = s.inputs[0], s.inputs[1]      # x (N, Cin, H, W), w (Cin, Cout/group, kH, kW)
    macs = _prod(x) * w[1] * _prod(w[2:])
    group = int(attribute(node, "group", 1))
    return 2 * macs, (w[1] * group, x[1] // max(group, 1))


def _gemm_ops(node, s: NodeShapes) -> Ops:
    a = s.inputs[0]
    k = a[0] if attribute(node, "transA", 0) else a[-1]
    m, n = s.output[0], s.output[1]
    return 2 * m * n * k, (n, k)


def _matmul_ops(node, s: NodeShapes) -> Ops:
    k = s.inputs[0][-1]
    n = s.output[-1] if len(s.output) else 1
    return 2 * _prod(s.output) * k, (n, k)


def _pool_ops(node, s: NodeShapes) -> Ops:
    kernel = attribute(node, "kernel_shape", []) or []
    return _prod(s.output) * max(_prod(kernel), 1), None


def _input_elements(node, s: NodeShapes) -> Ops:
    return (_prod(s.inputs[0]) if s.inputs else _prod(s.output)), None


def _output_elements(node, s: NodeShapes) -> Ops:
    return _prod(s.output), None


#: op type -> (node, shapes) -> Ops; any other op: its output elements
OPS_FORMULAS: Dict[str, Callable[[onnx.NodeProto, NodeShapes], Ops]] = {
    "Conv": _conv_ops,
    "ConvTranspose": _conv_transpose_ops,
    "Gemm": _gemm_ops,
    "MatMul": _matmul_ops,
    "MaxPool": _pool_ops,
    "AveragePool": _pool_ops,
    "GlobalAveragePool": _input_elements,
    "GlobalMaxPool": _input_elements,
    "ReduceMean": _input_elements,
    "ArgMax": _input_elements,
}


def aligned_shape(shape: Shape, channel_align: int) -> Shape:
    """The BPU's view of an output: NHWC with C padded (4-D), last dim padded otherwise."""
    if len(shape) == 4:
        n, c, h, w = shape
        return (n, h, w, align(c, channel_align))
    if len(shape) >= 1:
        return tuple(shape[:-1]) + (align(shape[-1], channel_align),)
    return tuple(shape)


# --- the piece --------------------------------------------------------------------

class _Piece(GraphIndex):
    """A piece's graph (bpuemu.host.onnxgraph.GraphIndex) with the tensor lookups through Q/DQ the costs need."""

    def __init__(self, model: onnx.ModelProto):
        super().__init__(model)
        self.vis = piece_tensors(model)
        self.graph_inputs = set(self.inputs)
        self.graph_outputs = set(self.outputs)

    def behind_dq(self, t: str) -> str:
        p = self.producer.get(t)
        return p.input[0] if p is not None and p.op_type == DQ else t

    def after_q(self, t: str) -> str:
        cons = self.readers(t)
        if cons and all(c.op_type == Q for c in cons) and t not in self.graph_outputs:
            return cons[0].output[0]
        return t

    def compute_readers(self, t: str) -> List[onnx.NodeProto]:
        """The non-Q/DQ nodes reading ``t``, looking through DequantizeLinear."""
        out = []
        for c in self.readers(t):
            if c.op_type == DQ:
                out.extend(n for n in self.readers(c.output[0]) if n.op_type not in (Q, DQ))
            elif c.op_type != Q:
                out.append(c)
        return out

    def nbytes(self, t: str) -> int:
        if t in self.inits:
            return int(numpy_helper.to_array(self.inits[t]).nbytes)
        vi = self.vis.get(t)
        if vi is None:
            return 0
        return _prod(value_shape(vi)) * np_dtype(vi.type.tensor_type.elem_type).itemsize

    def int8_bytes(self, t: str) -> int:
        """``t``'s size as the X5 holds it between BPU layers: one byte an element."""
        return _prod(self.shape(t)) if self.shape(t) else self.nbytes(t)

    def ddr_bytes(self, t: str, bpu: X5Bpu, strategy: CompileStrategy, int8: bool = False) -> Tuple[float, float]:
        """(bytes moved, bytes repacked) when ``t`` goes through DDR under ``strategy``.

        The latency share of the traffic uses the aligned layout (padded
        channels); the rest is packed to the valid shape and repacked by the
        data-movement unit.
        """
        valid = self.int8_bytes(t) if int8 else self.nbytes(t)
        if not valid:
            return 0.0, 0.0
        shape = self.shape(t)
        aligned = valid * _prod(aligned_shape(shape, bpu.channel_align_int)) / max(_prod(shape), 1)
        share = strategy.latency_share
        return share * aligned + (1 - share) * valid, (1 - share) * valid

    def shape(self, t: str) -> Shape:
        if t in self.inits:
            return tuple(self.inits[t].dims)
        vi = self.vis.get(t)
        return value_shape(vi) if vi is not None else ()


def subgraph_layers(model: onnx.ModelProto, bpu: X5Bpu, strategy: CompileStrategy = DEFAULT_STRATEGY,
                    fusion: Fusion = NO_FUSION, on_chip: FrozenSet[str] = frozenset()) -> List[Layer]:
    """The layers of one BPU subgraph piece, costed with ``bpu`` as ``strategy`` compiles them
    (start/end filled in order); ``fusion``: the plan's lookup-table groups (bpuemu.host.compiler.timing.fusion);
    ``on_chip``: the piece's inputs and outputs that the X5 hands between BPU layers of one graph (they go through
    DDR only when larger than the SRAM), where bpuemu's plan splits it into steps (``estimate.on_chip_tensors``)."""
    p = _Piece(one_transpose_view(model))   # an input's layout change: one move on the X5
    sram = bpu.sram_bytes * strategy.sram_share
    layers: List[Layer] = []
    by_output: Dict[str, Layer] = {}          # real output tensor -> layer that makes it
    loaded: set = set()
    clock = 0.0
    for node in p.nodes:
        if node.op_type in (Q, DQ):
            continue
        op = BPU_OPS.get(node.op_type)
        bpu_type = op.bpu_type if op else node.op_type
        unit = op.unit if op else "vector"
        real_in = [p.behind_dq(i) if i else "" for i in node.input]
        shapes = NodeShapes([p.shape(i) if i else () for i in node.input], p.shape(node.output[0]))
        formula = OPS_FORMULAS.get(node.op_type, _output_elements)
        ops, channels = formula(node, shapes)
        if unit == "view":
            ops = 0
        out_shape = shapes.output
        al_shape = aligned_shape(out_shape, bpu.channel_align_int)
        if channels is not None:
            a = bpu.channel_align_int
            pad = (align(channels[0], a) / max(channels[0], 1)) * (align(channels[1], a) / max(channels[1], 1))
        else:
            pad = _prod(al_shape) / max(_prod(out_shape), 1)
        layer = Layer(node.name, node.op_type, bpu_type, unit, int(ops), int(round(ops * pad)), out_shape, al_shape)

        # Fusion: a passive op with the BPU type of the one layer feeding it (the Relu after a Conv)
        # runs in that layer's output stage, when nothing else reads that layer's output.
        src_tensor = next((r for r in real_in if r in by_output), None)
        if fusion.role(node.name) == "fused":
            layer.fused_into = "lookup table"       # computed inside its group's one table
        elif strategy.fuses and op is not None and not op.active and src_tensor is not None:
            src = by_output[src_tensor]
            if src.bpu_type == bpu_type and not src.fused_into and len(p.compute_readers(src_tensor)) == 1:
                layer.fused_into = src.name

        repacked = 0.0
        for r in real_in:
            if not r:
                continue
            if r in p.inits:
                size = p.nbytes(r)
                layer.weight_bytes += size
                layer.loaded_bytes += size
            elif r in p.graph_inputs and r in on_chip:
                if r not in loaded and p.int8_bytes(r) > sram:
                    m, rp = p.ddr_bytes(r, bpu, strategy, int8=True)   # handed over through DDR: too large
                    layer.loaded_bytes += int(round(m))
                    repacked += rp
                loaded.add(r)
            elif r in p.graph_inputs:
                if r not in loaded:
                    layer.loaded_bytes += p.nbytes(r)
                    loaded.add(r)
            elif not layer.fused_into and p.nbytes(r) > sram:
                m, rp = p.ddr_bytes(r, bpu, strategy)       # spilled intermediate
                layer.loaded_bytes += int(round(m))
                repacked += rp
        for o in node.output:
            real = p.after_q(o)
            by_output[real] = layer
            handed_on = (real in p.graph_outputs and real in on_chip) or (o in p.graph_outputs and o in on_chip)
            if handed_on:
                if p.int8_bytes(real) > sram:
                    m, rp = p.ddr_bytes(real, bpu, strategy, int8=True)     # to the next step through DDR: too large
                    layer.stored_bytes += int(round(m))
                    repacked += rp
            elif real in p.graph_outputs or o in p.graph_outputs or p.nbytes(real) > sram:
                m, rp = p.ddr_bytes(real, bpu, strategy)    # a subgraph output, or a spilled intermediate
                layer.stored_bytes += int(round(m))
                repacked += rp

        layer.kind, layer.work = ("lut" if fusion.role(node.name) == "table" else layer_kind(node, p, op, unit)), 0.0
        layer.work = _work(layer, p, node)
        layer.repacked_bytes = repacked
        layer.pixels = _pixels(out_shape)
        if layer.kind == "matmul" and len(out_shape) >= 3:
            # the MAC array takes one head's second operand as its weights: one launch a head, its rows the pixels
            layer.launches, layer.pixels = max(_prod(out_shape[:-2]), 1), max(int(out_shape[-2]), 1)
        layer.barrier = int(_applies_a_pooled_gate(node, p, real_in))
        compute, memory, cycles = (float(v) for v in bpu.layer_cycles(
            KINDS.index(layer.kind), layer.work, repacked, layer.loaded_bytes + layer.stored_bytes,
            bool(layer.fused_into), strategy.overlaps, layer.pixels, layer.launches, layer.barrier))
        layer.compute_us, layer.load_store_us, layer.latency_us = bpu.us(compute), bpu.us(memory), bpu.us(cycles)
        layer.start_us = bpu.us(clock)
        clock += cycles
        layer.end_us = bpu.us(clock)
        layers.append(layer)
    return layers


#: Lookup-table activations: the BPU type HzLut (bpuemu.host.compiler.optable).
LUT_TYPES = ("HzLut",)

#: Operators bpuemu's plan runs on the CPU that the X5's compiler places on the BPU (the pieces of an
#: exported LayerNorm, GELU, Softmax or L2 normalization, shape ops, large-kernel convolutions), with
#: the timing model's kind: a CPU op made only of these is costed as BPU work (``x5_on_bpu``). Div is a
#: multiply by the divisor's reciprocal on the vector unit (a constant's folded, a tensor's is a table over
#: the divisor: LayerNorm's per-position deviation, a few elements); Erf a lookup table (GELU's chain is
#: usually one table as a whole: ``fusion``).
X5_BPU_EXTRA = {
    "Div": "vector", "Sqrt": "lut", "Reciprocal": "lut", "Erf": "lut", "Log": "lut", "Sin": "lut", "Cos": "lut",
    "Softplus": "lut", "Elu": "lut", "Gelu": "lut",
    "ReduceMax": "vector", "ReduceSum": "vector", "ReduceMin": "vector", "ReduceL2": "vector", "ReduceMean": "vector",
    "Clip": "vector", "Max": "vector", "Min": "vector", "Abs": "vector", "Neg": "vector", "Relu": "vector",
    "Equal": "vector", "Greater": "vector", "Less": "vector", "Where": "vector", "Softmax": "vector",
    "LayerNormalization": "vector", "InstanceNormalization": "vector", "BatchNormalization": "vector",
    "Transpose": "move", "Expand": "move", "Tile": "move", "Gather": "move", "Concat": "move", "Slice": "move",
    "Split": "move", "Pad": "move", "DepthToSpace": "move", "SpaceToDepth": "move",
    "Squeeze": "view", "Unsqueeze": "view", "Reshape": "view", "Flatten": "view",
    "Conv": "conv",
}


def layer_kind(node: onnx.NodeProto, p: "_Piece", op, unit: str) -> str:
    """The timing model's kind of a layer (``x5.KINDS``)."""
    if unit == "mac":
        if node.op_type == "Conv":
            weight = p.shape(p.behind_dq(node.input[1]))
            if int(attribute(node, "group", 1)) > 1 and len(weight) > 1 and weight[1] == 1:
                return "dwconv"             # depthwise; a grouped conv with several channels per group is dense per group
            kernel = attribute(node, "kernel_shape", None) or list(weight[2:])
            return "conv1x1" if all(int(k) == 1 for k in kernel) else "conv"
        if node.op_type == "ConvTranspose":
            return "conv"
        if node.op_type == "MatMul":
            weights = len(node.input) > 1 and p.behind_dq(node.input[1]) in p.inits
            return "conv1x1" if weights else "matmul"
        return "conv1x1"                    # Gemm
    if op is None and node.op_type in X5_BPU_EXTRA:
        kind = X5_BPU_EXTRA[node.op_type]
        if kind == "conv":
            weight = p.shape(p.behind_dq(node.input[1]))
            return "dwconv" if len(weight) > 1 and weight[1] == 1 and int(attribute(node, "group", 1)) > 1 else "conv"
        return kind
    if unit in ("move", "view"):
        return unit
    return "lut" if op is not None and op.bpu_type in LUT_TYPES else "vector"


#: Elementwise operators that can apply a gate (one input broadcast over the other).
_GATE_OPS = ("Mul", "Add", "Sub", "Div")


def _applies_a_pooled_gate(node: onnx.NodeProto, p: "_Piece", real_in: Sequence[str]) -> bool:
    """A squeeze-excitation's gate: an elementwise op of a 4-D map (H x W > 1) and a per-channel 1 x 1 tensor."""
    if node.op_type not in _GATE_OPS:
        return False
    shapes = [p.shape(t) for t in real_in if t and t not in p.inits]
    if len(shapes) != 2 or any(len(s) != 4 for s in shapes):
        return False
    spatial = sorted(int(s[2]) * int(s[3]) for s in shapes)
    return spatial[0] == 1 and spatial[1] > 1 and min(int(s[1]) for s in shapes) > 1


def _pixels(shape: Shape) -> int:
    """H x W of an NCHW output; the rows of anything else (all but the last dim)."""
    if len(shape) == 4:
        return max(int(shape[2]) * int(shape[3]), 1)
    return max(_prod(shape[:-1]), 1) if len(shape) >= 2 else 1


def _work(layer: Layer, p: "_Piece", node: onnx.NodeProto) -> float:
    """MACs (aligned; a grouped conv's unaligned), elements (aligned) or bytes moved."""
    if layer.kind == "dwconv":
        return layer.ops / 2.0
    if layer.kind in ("conv", "conv1x1", "matmul"):
        return layer.aligned_ops / 2.0
    if layer.kind == "move":
        out = p.after_q(node.output[0])
        size = p.nbytes(out) or _prod(layer.output_shape)
        return float(size) * _prod(layer.aligned_output_shape) / max(_prod(layer.output_shape), 1)
    if layer.kind == "view":
        return 0.0
    return float(layer.aligned_ops)


def io_tensors(model: onnx.ModelProto) -> Tuple[List[dict], List[dict]]:
    """The subgraph's inputs and outputs: name, shape, dtype, bytes."""
    p = _Piece(model)
    g = model.graph

    def desc(name):
        vi = p.vis[name]
        return {"name": name, "shape": list(value_shape(vi)), "dtype": np_dtype(vi.type.tensor_type.elem_type).name,
                "bytes": p.nbytes(name)}

    return [desc(i.name) for i in g.input if i.name not in p.inits], [desc(o.name) for o in g.output]
