"""Which tensors get quantized, and how they relate: the quantization plan.

Per-op quantizers, in a registry keyed by op type, only *mark* tensors of the
BPU nodes (activation inputs, outputs, weights with their channel axis,
biases); nothing is rewritten here. ``build_plan`` then resolves the marks
into a ``QuantPlan``:

* every activation input and output of a BPU node is quantized; the BPU node
  reads the dequantized tensor, and so does every consumer when no float
  version exists (the producer runs on the BPU, or the tensor is an int8
  image input); a CPU consumer of a CPU-made tensor keeps reading the float;
* passive ops (Relu, Clip, MaxPool, Reshape, Concat, Resize, ...) share one
  scale with their inputs ("scale groups"), as the BPU quantizes them
  passively. In a group, a tensor read only by a Relu/Clip of the same group
  (Conv -> Relu) takes its range from the Relu's output: the BPU fuses the two,
  and symmetric int8 would otherwise spend half its range on values the Relu
  discards;
* an op that takes one scale (``PER_TENSOR_ONLY``: pooling, lookup-table
  activations) reads a per-channel tensor through a requantize to one scale
  (``QuantPlan.single_scale_reads``), as the BPU brings such a tensor to one
  scale before the op: the tensor stays per-channel for its other readers.
  Only when such ops are all that read it does its group calibrate per tensor
  (one rounding instead of two); an op's output is per tensor;
* int16 requests (node_info InputType/OutputType, set_{NodeKind}_*_int16,
  set_model_output_int16) apply to whole groups, and fall back to int8 with a
  log line when the context does not support int16.
"""
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import onnx

from bpuemu.host.compiler.optable import BPU_OPS
from bpuemu.host.onnxgraph import GraphIndex, TensorInfo, attr, tensor_infos
from bpuemu.host.quant.options import Int16Spec, QuantOptions

#: Ops whose output takes the scale of their input: the op table's passively quantized ops.
PASSIVE_OPS = frozenset(op for op, spec in BPU_OPS.items() if not spec.active)
#: Passive ops that keep axis 1 as the channel axis, so per-channel featuremap scales pass through.
CHANNEL_PRESERVING = frozenset({"Relu", "Clip", "MaxPool", "GlobalMaxPool", "Resize", "Upsample"})
#: Ops that take one scale on their quantized input and output: stock onnxruntime fuses DQ -> op -> Q into a
#: QLinear op that takes only a scalar scale (QLinearAveragePool, QLinearGlobalAveragePool, and the lookup
#: tables of QLinearSigmoid / QLinearLeakyRelu / QLinearSoftmax) and refuses to load the model otherwise.
#: Their output is per tensor; a per-channel input reaches them through a requantize to one scale.
PER_TENSOR_ONLY = frozenset({"AveragePool", "GlobalAveragePool", "Sigmoid", "LeakyRelu", "Softmax"})
RELU_LIKE = frozenset({"Relu", "Clip"})
#: BPU ops that can read/write int16 on X5 (the seeds give no list; Softmax stays int8 here).
INT16_OPS = frozenset(op for op in BPU_OPS if op != "Softmax")


@dataclass
class ActivationSite:
    """One quantized activation tensor."""

    tensor: str
    producer: Optional[str]             # node name; None for a graph input
    producer_on_bpu: bool
    is_graph_input: bool
    is_graph_output: bool
    fixed_int8: bool                    # an X_128 image input: int8 in the quantized model
    info: Optional[TensorInfo]
    quantized_readers: List[Tuple[str, int]] = field(default_factory=list)   # (node, input index)
    group: int = -1

    @property
    def float_exists(self) -> bool:
        """Whether the quantized model still has this tensor in float (made by a CPU node / float input)."""
        return not self.fixed_int8 and not self.producer_on_bpu

    @property
    def channels(self) -> Optional[int]:
        s = self.info.shape if self.info else None
        return s[1] if s and len(s) >= 2 and s[1] > 0 else None


@dataclass
class WeightSite:
    tensor: str
    axis: int
    readers: List[Tuple[str, int]] = field(default_factory=list)


@dataclass
class BiasSite:
    node: str
    index: int                 # bias input index of the node
    tensor: Optional[str]      # the float bias initializer; None when the node has none
    activation: str            # the input activation tensor whose scale multiplies the weight's
    weight: str
    channels: int              # output channels
    period: int                # weight scale of output channel c is weight_scale[c % period]


@dataclass
class Group:
    """Tensors that share one set of quantization parameters."""

    id: int
    members: List[str]
    sources: List[str]          # members whose statistics set the range
    dtype: str = "int8"
    fixed: bool = False         # holds an X_128 input: scale 1 / zero point 0
    channels: Optional[int] = None   # per-channel calibration is possible along axis 1 with this many channels
    int16_requests: List[str] = field(default_factory=list)


@dataclass
class QuantPlan:
    """The marked model: what calibration measures and quantization rewrites."""

    model: onnx.ModelProto                       # the normalized float model
    bpu_nodes: FrozenSet[str]
    int8_inputs: Tuple[str, ...]
    activations: Dict[str, ActivationSite]       # in graph order
    weights: Dict[str, WeightSite]
    biases: Dict[str, BiasSite]
    groups: List[Group]
    node_activation_inputs: Dict[str, List[str]]  # BPU node -> its quantized activation inputs
    infos: Dict[str, TensorInfo]
    #: tensor -> its quantized reads (node, input index) by ops that take one scale: they read it
    #: requantized to one scale when it is per channel
    single_scale_reads: Dict[str, List[Tuple[str, int]]] = field(default_factory=dict)

    def group_of(self, tensor: str) -> Group:
        return self.groups[self.activations[tensor].group]

    def stat_tensors(self) -> List[str]:
        """Tensors whose statistics calibration needs."""
        return [t for g in self.groups if not g.fixed for t in g.sources]

    def nodes_reading(self, group: Group) -> Set[str]:
        return {n for t in group.members for n, _ in self.activations[t].quantized_readers}


class Marker:
    """What a per-op quantizer may do: mark tensors of one BPU node."""

    def __init__(self, idx: GraphIndex, infos: Dict[str, TensorInfo]):
        self.idx = idx
        self.infos = infos
        self.activation_reads: List[Tuple[str, str, int]] = []   # (tensor, node, index)
        self.outputs: List[Tuple[str, str]] = []                 # (tensor, node)
        self.ties: List[Tuple[str, str, str]] = []               # (a, b, op_type)
        self.weights: Dict[str, WeightSite] = {}
        self.biases: Dict[str, BiasSite] = {}

    def is_float_activation(self, name: str) -> bool:
        if not name or name in self.idx.inits:
            return False
        info = self.infos.get(name)
        return info is not None and info.is_float

    def activation(self, node: onnx.NodeProto, index: int) -> bool:
        if index < len(node.input) and self.is_float_activation(node.input[index]):
            self.activation_reads.append((node.input[index], node.name, index))
            return True
        return False

    def output(self, node: onnx.NodeProto, index: int, tie_to_input: Optional[int] = None) -> None:
        if index >= len(node.output) or not self.is_float_activation(node.output[index]):
            return
        out = node.output[index]
        self.outputs.append((out, node.name))
        if tie_to_input is not None and tie_to_input < len(node.input) and self.is_float_activation(node.input[tie_to_input]):
            self.ties.append((node.input[tie_to_input], out, node.op_type))

    def weight(self, node: onnx.NodeProto, index: int, axis: int) -> bool:
        name = node.input[index] if index < len(node.input) else ""
        if name not in self.idx.inits or self.infos[name].elem_type != onnx.TensorProto.FLOAT:
            return False
        site = self.weights.setdefault(name, WeightSite(name, axis))
        if site.axis != axis:  # one initializer used with two layouts: keep it float for the second
            return False
        site.readers.append((node.name, index))
        return True

    def bias(self, node: onnx.NodeProto, index: int, activation: int, weight: int, channels: int, period: int) -> None:
        name = node.input[index] if index < len(node.input) and node.input[index] else None
        if name is not None:
            if name not in self.idx.inits or self.infos[name].elem_type != onnx.TensorProto.FLOAT:
                return
            if list(self.infos[name].shape or []) != [channels]:
                return
        self.biases[node.name] = BiasSite(node.name, index, name, node.input[activation], node.input[weight], channels, period)


# --- per-op quantizers ---------------------------------------------------------------------

OpQuantizer = Callable[[onnx.NodeProto, Marker], None]
OP_QUANTIZERS: Dict[str, OpQuantizer] = {}


def quantizer(*op_types: str):
    def register(fn: OpQuantizer) -> OpQuantizer:
        for op in op_types:
            OP_QUANTIZERS[op] = fn
        return fn
    return register


def _all_activations(node, m: Marker) -> None:
    for k in range(len(node.input)):
        m.activation(node, k)
    for k in range(len(node.output)):
        m.output(node, k)


@quantizer("Conv")
def _conv(node, m: Marker) -> None:
    m.activation(node, 0)
    has_w = m.weight(node, 1, axis=0)
    m.output(node, 0)
    if has_w:
        cout = m.infos[node.input[1]].shape[0]
        m.bias(node, 2, 0, 1, cout, cout)
    elif len(node.input) > 1:
        m.activation(node, 1)


@quantizer("ConvTranspose")
def _conv_transpose(node, m: Marker) -> None:
    m.activation(node, 0)
    has_w = m.weight(node, 1, axis=1)
    m.output(node, 0)
    if has_w:
        per_group = m.infos[node.input[1]].shape[1]
        m.bias(node, 2, 0, 1, per_group * int(attr(node, "group", 1)), per_group)


@quantizer("Gemm")
def _gemm(node, m: Marker) -> None:
    m.activation(node, 0)
    trans_b = int(attr(node, "transB", 0))
    has_w = m.weight(node, 1, axis=0 if trans_b else 1)
    if not has_w:
        m.activation(node, 1)
    m.output(node, 0)
    if has_w:
        n_out = m.infos[node.input[1]].shape[0 if trans_b else 1]
        if len(node.input) > 2 and node.input[2] and node.input[2] not in m.idx.inits:
            m.activation(node, 2)
        else:
            m.bias(node, 2, 0, 1, n_out, n_out)
    elif len(node.input) > 2:
        m.activation(node, 2)


@quantizer("MatMul")
def _matmul(node, m: Marker) -> None:
    m.activation(node, 0)
    b = node.input[1]
    if not (b in m.idx.inits and m.weight(node, 1, axis=len(m.infos[b].shape) - 1)):
        m.activation(node, 1)
    m.output(node, 0)


@quantizer(*sorted(PASSIVE_OPS - {"Concat"}))
def _passive(node, m: Marker) -> None:
    m.activation(node, 0)
    for k in range(len(node.output)):
        m.output(node, k, tie_to_input=0)


@quantizer("Concat")
def _concat(node, m: Marker) -> None:
    marked = [k for k in range(len(node.input)) if m.activation(node, k)]
    m.output(node, 0, tie_to_input=marked[0] if marked else None)
    if marked and m.is_float_activation(node.output[0]):
        m.ties.extend((node.input[k], node.output[0], node.op_type) for k in marked[1:])


def _mark(node: onnx.NodeProto, m: Marker) -> None:
    OP_QUANTIZERS.get(node.op_type, _all_activations)(node, m)


# --- resolving marks into a plan -------------------------------------------------------------

class _UnionFind:
    def __init__(self):
        self.parent: Dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def build_plan(
    model: onnx.ModelProto,
    bpu_nodes: Set[str],
    int8_inputs: Sequence[str],
    options: QuantOptions,
    log: logging.Logger,
) -> QuantPlan:
    """Mark the BPU nodes of ``model`` (already normalized) and resolve groups and int16."""
    idx = GraphIndex(model)
    infos = tensor_infos(model)
    bpu = frozenset(n.name for n in idx.nodes if n.name in bpu_nodes and n.op_type not in ("QuantizeLinear", "DequantizeLinear"))
    unknown = set(bpu_nodes) - {n.name for n in idx.nodes}
    if unknown:
        log.debug("bpu_nodes not in the model (ignored): %s", sorted(unknown))
    for name in int8_inputs:
        if name not in idx.inputs:
            from bpuemu.common.errors import InvalidInput

            raise InvalidInput(f"int8 input '{name}' is not an input of the model (inputs: {', '.join(idx.inputs)})")

    marker = Marker(idx, infos)
    for node in idx.nodes:
        if node.name in bpu:
            _mark(node, marker)
    if options.high_precision_outputs:  # the J6 tail Conv: its output leaves the BPU unquantized
        high = options.high_precision_outputs
        marker.outputs = [(t, n) for t, n in marker.outputs if t not in high]
        marker.ties = [tie for tie in marker.ties if tie[0] not in high and tie[1] not in high]

    # Activation sites, in graph order (inputs first, then node outputs).
    quantized: Set[str] = {t for t, _, _ in marker.activation_reads} | {t for t, _ in marker.outputs} | set(int8_inputs)
    order = [t for t in idx.inputs if t in quantized] + [o for n in idx.nodes for o in n.output if o in quantized]
    outputs = set(idx.outputs)
    sites: Dict[str, ActivationSite] = {}
    for t in order:
        p = idx.producer.get(t)
        sites[t] = ActivationSite(
            tensor=t,
            producer=p.name if p is not None else None,
            producer_on_bpu=p is not None and p.name in bpu,
            is_graph_input=p is None,
            is_graph_output=t in outputs,
            fixed_int8=t in int8_inputs,
            info=infos.get(t),
        )
    for t, site in sites.items():
        for node, k in idx.consumers.get(t, []):
            if node.name in bpu or not site.float_exists:
                site.quantized_readers.append((node.name, k))

    node_inputs: Dict[str, List[str]] = {}
    for t, node, _ in marker.activation_reads:
        lst = node_inputs.setdefault(node, [])
        if t not in lst:
            lst.append(t)

    groups = _scale_groups(idx, bpu, sites, marker.ties)
    single_scale = _single_scale_reads(idx, sites, groups)
    plan = QuantPlan(model, bpu, tuple(int8_inputs), sites, marker.weights, marker.biases, groups, node_inputs, infos,
                     single_scale)
    _request_int16(plan, idx, options, log)
    return plan


def _scale_groups(idx: GraphIndex, bpu: FrozenSet[str], sites: Dict[str, ActivationSite],
                  ties: Sequence[Tuple[str, str, str]]) -> List[Group]:
    """Activation sites that must share one scale (the markers' ties), joined by union-find.

    Each group records its members, its sources (the tensors whose statistics set
    its range: not a tensor read only by a fused Relu-like op on the BPU), whether
    it holds a fixed int8 image input, and its channel count when every tie keeps
    channels apart (per-channel featuremap scales). Sets ``site.group`` on every site.
    """
    outputs = set(idx.outputs)
    uf = _UnionFind()
    for t in sites:
        uf.find(t)
    tie_ops: Dict[str, Set[str]] = {}
    fixed = {t for t in sites if sites[t].fixed_int8}
    fixed_roots = set(fixed)
    for a, b, op in ties:
        ra, rb = uf.find(a), uf.find(b)
        # Never pull a featuremap into the scale-1 group of an image input (a Concat of the two):
        # those stay alone. A one-input passive op on the image (HzPreprocess's Transpose of an
        # nv12 input) moves the same int8 values, so its output joins the image's scale-1 group.
        if ra == rb or ((ra in fixed_roots or rb in fixed_roots) and op == "Concat"):
            continue
        uf.union(a, b)
        root = uf.find(a)
        if ra in fixed_roots or rb in fixed_roots:
            fixed_roots.add(root)
        tie_ops[root] = tie_ops.pop(ra, set()) | tie_ops.pop(rb, set()) | {op}

    members: Dict[str, List[str]] = {}
    for t in sites:
        members.setdefault(uf.find(t), []).append(t)
    groups: List[Group] = []
    for root, mem in members.items():
        gid = len(groups)
        mem_set = set(mem)
        sources = []
        for t in mem:
            readers = idx.consumers.get(t, [])
            relu_only = (
                readers
                and t not in outputs
                and all(n.name in bpu and n.op_type in RELU_LIKE and k == 0 and n.output[0] in mem_set for n, k in readers)
            )
            if not relu_only:
                sources.append(t)
        group = Group(gid, mem, sources or list(mem), fixed=bool(mem_set & fixed))
        chans = {sites[t].channels for t in mem}
        if any(sites[t].producer is not None and idx.by_name[sites[t].producer].op_type in PER_TENSOR_ONLY for t in mem):
            chans = {None}
        ranks = {len(sites[t].info.shape) if sites[t].info and sites[t].info.shape else 0 for t in mem}
        if not group.fixed and len(chans) == 1 and None not in chans and len(ranks) == 1 and \
                tie_ops.get(root, set()) <= CHANNEL_PRESERVING:
            group.channels = chans.pop()
        for t in mem:
            sites[t].group = gid
        groups.append(group)
    return groups


def _single_scale_reads(idx: GraphIndex, sites: Dict[str, ActivationSite],
                        groups: List[Group]) -> Dict[str, List[Tuple[str, int]]]:
    """The reads of quantized tensors by ops that take one scale (``PER_TENSOR_ONLY``, with a quantized
    output: what stock onnxruntime fuses into a QLinear op), by tensor: where the tensor is per channel
    (calibrated so, or read so from a QAT model), they go through a requantize to one scale.

    A per-channel group read by other nodes too (a readout that is not an op of the group itself: the Mul
    of a squeeze-excitation block beside its GlobalAveragePool, a model output) stays per-channel. A
    per-channel group read only by such ops is calibrated per tensor instead (``channels`` None): its
    producer writes the one scale directly.
    """
    def one_scale(node: onnx.NodeProto) -> bool:
        return node.op_type in PER_TENSOR_ONLY and any(o in sites for o in node.output)

    out: Dict[str, List[Tuple[str, int]]] = {}
    for group in groups:
        members = set(group.members)
        reads: Dict[str, List[Tuple[str, int]]] = {}
        other = any(sites[t].is_graph_output and sites[t].producer_on_bpu for t in group.members)
        for t in group.members:
            for name, k in sites[t].quantized_readers:
                node = idx.by_name[name]
                if one_scale(node):
                    reads.setdefault(t, []).append((name, k))
                elif not all(o in members for o in node.output if o):
                    other = True
        out.update(reads)
        if reads and not other:
            group.channels = None
    return out


def _request_int16(plan: QuantPlan, idx: GraphIndex, options: QuantOptions, log: logging.Logger) -> None:
    """Record int16 requests on groups; refuse those whose context cannot be int16."""
    def request(tensor: str, who: str) -> None:
        site = plan.activations.get(tensor)
        if site is None:
            log.info("%s: tensor '%s' is not quantized (its nodes run on the CPU); int16 does not apply, falls back to float/int8",
                     who, tensor)
            return
        group = plan.groups[site.group]
        if group.fixed:
            log.info("%s: '%s' is an int8 image input; int16 is not supported here and falls back to int8", who, tensor)
            return
        touching = {n for t in group.members for n, _ in plan.activations[t].quantized_readers}
        touching |= {plan.activations[t].producer for t in group.members if plan.activations[t].producer_on_bpu}
        bad = sorted(n for n in touching if n in plan.bpu_nodes and idx.by_name[n].op_type not in INT16_OPS)
        if bad:
            log.info("%s: int16 on '%s' is not supported with %s (%s); falls back to int8", who, tensor, ", ".join(bad),
                     ", ".join(sorted({idx.by_name[n].op_type for n in bad})))
            return
        group.int16_requests.append(who)

    specs: Dict[str, Int16Spec] = {}
    for node in idx.nodes:
        spec = options.int16_kinds.get(node.op_type)
        if node.name in options.int16_nodes:
            spec = options.int16_nodes[node.name] if spec is None else spec.merged(options.int16_nodes[node.name])
        if spec is not None:
            specs[node.name] = spec
    for name in options.int16_nodes:
        if name not in idx.by_name:
            log.warning("node_info names '%s', which is not a node of the model", name)
    for name, spec in specs.items():
        node = idx.by_name[name]
        if name not in plan.bpu_nodes:
            if spec.all_inputs or spec.inputs or spec.output:
                log.info("node %s (%s) runs on the CPU in float; its int16 configuration falls back (not quantized)",
                         name, node.op_type)
            continue
        for k in spec.input_indices(len(node.input)):
            t = node.input[k]
            if t and t in plan.activations:
                request(t, f"node {name} input {k}")
        if spec.output:
            for t in node.output:
                if t:
                    request(t, f"node {name} output")
    if options.model_output_type == "int16":
        for t in idx.outputs:
            site = plan.activations.get(t)
            if site is not None and site.producer_on_bpu:
                request(t, "set_model_output_int16")
