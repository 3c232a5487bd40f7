"""A model that outputs many intermediate tensors, run as consecutive parts: one part's outputs in memory at a time.

Calibration statistics and the cosine table run the float (and quantized)
model with every activation as an output: on PP-OCRv4 det at 640x640 that is
376 MB per run, all alive until the run returns, per sample worker. ``Parts``
cuts the graph (its nodes in their topological order) into consecutive
pieces, each outputting about ``CUT_BYTES`` (2 MB) of the wanted tensors
(sizes from shape inference) when all of them take more than ``PART_BYTES``
(64 MB), and runs them one after the other, each on the
tensors the earlier ones computed: every node still runs once per sample, so
the cost is one run's (plus one session call per part), and the caller
reduces each part's tensors before the next part's are computed.

Each part computes exactly what the whole model computes: the session options
are the same (the board's, one thread), each node runs the same kernel on the
same input values, and the graph is only cut where every tensor crossing the
cut is already an output of the whole model, a graph input or not a float
tensor (so onnxruntime's fusions see the same graph outputs around every float
node), and where no layout-sensitive node is reached from it before the next
Conv (``_layout_pinned``). Nodes computed from initializers alone (Constant, a
weight's DequantizeLinear) are copied into each part that reads them, so
onnxruntime folds and pre-packs them as in the whole model; each part's inputs
carry the shapes inferred on the whole model (without them onnxruntime would
keep some pools out of its NCHWc layout). tests/host/test_real_models.py checks
the five artifacts of the sample CNN, PP-OCR cls and det byte-identical with
parts of 64 KB and with one part.

Part sessions should share one memory arena (``open_session(arena="shared")``):
an arena per part keeps every part's outputs allocated, the whole run's total
again; without an arena the pages are faulted in anew on every run (more CPU
time on every run).
"""
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence

import numpy as np
import onnx
from onnx import helper

from bpuemu.host.onnxgraph.model import TensorInfo, tensor_infos
from bpuemu.host.onnxgraph.session import PartedSession, open_session

#: Ops that compute the same values whatever the memory layout of their inputs (``_layout_pinned``).
#: onnxruntime runs some nodes in its blocked NCHWc layout when their input comes from an NCHWc node;
#: an average pool, a BatchNormalization or a linear Resize then sums in another order than from a
#: graph input (a Conv reorders its input itself: the same values).
LAYOUT_FREE = frozenset({
    "Conv", "Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid",
    "HardSigmoid", "HardSwish", "Tanh", "Abs", "Neg", "Exp", "MaxPool", "GlobalMaxPool", "Concat", "Reshape",
    "Flatten", "Transpose", "Identity", "Slice", "Split", "Squeeze", "Unsqueeze", "Shape", "Cast",
    "QuantizeLinear", "DequantizeLinear",
})

#: Bytes of wanted outputs above which a model is cut into parts (PP-OCRv4 det's 376 MB of activations
#: at 640x640 is; det 160's 24 MB, PP-OCR cls and the sample CNN are not).
PART_BYTES = 64 << 20
#: Bytes of wanted outputs per part of a model that is cut: about what a core's L2 cache holds on
#: common x86 server cores, so that the part's outputs are still there when the caller reduces them
#: and the next part reuses the same arena memory (smaller and larger parts were slower: the A/Bs are
#: in bench/RESULTS.md, "Statistics, kernels and parts").
CUT_BYTES = 2 << 20

def tensor_bytes(info: Optional[TensorInfo]) -> Optional[int]:
    """Bytes of a tensor from its inferred type and shape; None when a dimension is unknown."""
    if info is None or info.shape is None or any(d < 0 for d in info.shape):
        return None
    return int(np.prod(info.shape, dtype=np.int64)) * np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type)).itemsize


@dataclass
class _Part:
    model: onnx.ModelProto
    inputs: List[str]        # graph inputs of the part: the model's inputs and earlier parts' tensors
    fetch: List[str]         # its graph outputs: the whole model's outputs it makes, then what later parts read
    wanted: List[str]        # what ``consume`` gets
    carry: List[str]         # fetched tensors later parts read
    drop: List[str]          # carried tensors no later part reads (freed after this part)
    session: object = None


class Parts(PartedSession):
    """``model`` (whose graph outputs include ``wanted``), in one part when its wanted tensors take
    ``budget`` bytes (PART_BYTES by default) or less, else cut into parts of about CUT_BYTES of them
    each (``budget``, when smaller); one part when a size is unknown or the model has subgraphs.
    ``open(open_session)`` opens the parts' sessions; ``run(feed, consume)`` calls
    ``consume({name: value})`` once per part, in graph order, with that part's wanted tensors."""

    def __init__(self, model: onnx.ModelProto, wanted: Sequence[str], infos: Optional[Mapping[str, TensorInfo]] = None,
                 budget: Optional[int] = None):
        budget = PART_BYTES if budget is None else budget
        infos = tensor_infos(model) if infos is None else infos
        g = model.graph
        inits = {t.name for t in g.initializer}
        self.inputs = [i.name for i in g.input if i.name not in inits]
        outputs = [o.name for o in g.output]
        self.wanted = list(dict.fromkeys(wanted))
        # Nodes computed from initializers alone (Constant, a weight's DequantizeLinear, shapes of
        # constants) go into every part that reads them instead of crossing a cut: onnxruntime folds
        # them or pre-packs the weights they make, as it does in the whole model.
        const: Dict[str, onnx.NodeProto] = {}
        nodes: List[onnx.NodeProto] = []
        for n in g.node:
            if all(i in inits or i in const for i in n.input if i) and \
                    not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
                const.update({o: n for o in n.output if o})
            else:
                nodes.append(n)
        made_by = {o: k for k, n in enumerate(nodes) for o in n.output if o}
        missing = [t for t in self.wanted if not (t in made_by or t in const or t in self.inputs) or
                   t not in outputs + self.inputs]
        if missing:
            raise ValueError(f"wanted tensors must be graph inputs or outputs of the model: {missing[:5]}")
        last_read: Dict[str, int] = {}
        readers: Dict[str, List[onnx.NodeProto]] = {}
        for k, n in enumerate(nodes):
            for i in n.input:
                if i:
                    last_read[i] = k
                    readers.setdefault(i, []).append(n)
        pinned = _layout_pinned(nodes, readers)
        has_subgraphs = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in nodes for a in n.attribute)
        sized = all(tensor_bytes(infos.get(t)) is not None for t in self.wanted if t in made_by)
        total = sum(tensor_bytes(infos.get(t)) for t in self.wanted if t in made_by) if sized else 0
        piece = min(budget, CUT_BYTES) if total > budget else budget
        cuts = self._cuts(nodes, infos, set(self.wanted), set(outputs), last_read, set(self.inputs) | inits | set(const), pinned, piece) \
            if nodes and sized and not has_subgraphs else []
        bounds = [0] + cuts + [len(nodes)]
        self.parts: List[_Part] = []
        carried: List[str] = []          # tensors of earlier parts that this or a later part reads
        delivered = set()
        for a, b in zip(bounds, bounds[1:]):
            part_nodes = nodes[a:b]
            needed = {i for n in part_nodes for i in n.input if i in const}
            if a == 0:
                needed |= {t for t in self.wanted if t in const}
            stack = list(needed)
            while stack:
                for i in const[stack.pop()].input:
                    if i in const and i not in needed:
                        needed.add(i)
                        stack.append(i)
            const_nodes = [n for n in g.node if any(o in needed for o in n.output)]
            part_nodes = const_nodes + part_nodes
            made = [o for n in part_nodes for o in n.output if o]
            made_set = set(made)
            reads = {i for n in part_nodes for i in n.input if i}
            ins = [t for t in self.inputs if t in reads] + [t for t in carried if t in reads]
            carry = [t for t in made if t in made_by and last_read.get(t, -1) >= b]
            fetch = list(dict.fromkeys([t for t in outputs if t in made_set] + carry))
            wanted_here = [t for t in self.wanted if t not in delivered and (t in made_set or (a == 0 and t in self.inputs))]
            delivered.update(wanted_here)
            carried_after = [t for t in carried + carry if last_read.get(t, -1) >= b]
            drop = [t for t in carried if t not in carried_after]
            self.parts.append(_Part(_sub_model(model, part_nodes, ins, fetch, infos), ins, fetch, wanted_here, carry, drop))
            carried = carried_after

    @staticmethod
    def _cuts(nodes, infos, wanted, outputs, last_read, free, pinned, budget) -> List[int]:
        """Node positions to cut before: greedy, a cut once the part's wanted bytes reach ``budget``,
        only where every tensor crossing the cut is a graph output, an input or constant, or not a
        float tensor (so no fusion onnxruntime makes in the whole model is split), and no
        layout-sensitive node reads it (``LAYOUT_FREE``)."""
        cuts: List[int] = []
        live: Dict[str, None] = {}      # tensors made before position k and read at k or later
        acc = 0
        for k, n in enumerate(nodes):
            for t in [t for t in live if last_read.get(t, -1) < k]:
                del live[t]
            if k and acc >= budget and all(t not in pinned and (t in outputs or t in free or not (t in infos and infos[t].is_float))
                                           for t in live):
                cuts.append(k)
                acc = 0
            for o in n.output:
                if o and o in wanted:
                    acc += tensor_bytes(infos.get(o)) or 0
                if o and last_read.get(o, -1) > k:
                    live[o] = None
        return cuts

    def __len__(self) -> int:
        return len(self.parts)

    def open(self, opener: Callable[[onnx.ModelProto], object]) -> "Parts":
        """Open each part's session with ``opener(part_model)``; returns self."""
        for p in self.parts:
            p.session = opener(p.model)
        return self

    def get_inputs(self):
        """The model inputs' NodeArgs (name and type) as the parts' sessions list them (for feed_for)."""
        seen, out = set(), []
        for p in self.parts:
            for i in p.session.get_inputs():
                if i.name in self.inputs and i.name not in seen:
                    seen.add(i.name)
                    out.append(i)
        return out

    def iter_run(self, feed: Mapping[str, np.ndarray]) -> Iterator[Dict[str, np.ndarray]]:
        """One run of the model on ``feed``, part by part: each part's ``{wanted name: value}``, in
        graph order; what a part carries for later parts is freed once no later part reads it."""
        held: Dict[str, np.ndarray] = dict(feed)
        for p in self.parts:
            values = dict(zip(p.fetch, p.session.run(p.fetch, {t: held[t] for t in p.inputs})))
            for t in p.carry:
                held[t] = values[t]
            wanted = {t: values[t] if t in values else held[t] for t in p.wanted}
            del values
            yield wanted
            del wanted
            for t in p.drop:
                del held[t]

    def run(self, feed: Mapping[str, np.ndarray], consume: Callable[[Dict[str, np.ndarray]], None]) -> None:
        """``consume(values)`` for each part's wanted tensors of one run (``iter_run``)."""
        for values in self.iter_run(feed):
            consume(values)



def open_parted(model: onnx.ModelProto, names: Sequence[str], infos: Mapping[str, TensorInfo]):
    """What runs ``model``, which outputs ``names``: its parts opened (``Parts``), or one session when
    it is one part; every session in the one shared onnxruntime arena (``open_session(arena="shared")``)."""
    parts = Parts(model, names, infos)
    if len(parts) == 1:
        return open_session(model, arena="shared")
    return parts.open(lambda m: open_session(m, arena="shared"))


def _layout_pinned(nodes: Sequence[onnx.NodeProto], readers: Mapping[str, List[onnx.NodeProto]]) -> set:
    """Tensors that must not cross a cut: from them a layout-sensitive node (not in ``LAYOUT_FREE``)
    is reached through nodes other than Conv. onnxruntime keeps a chain of elementwise nodes in its
    NCHWc layout when the chain's input is NCHWc (a Conv's output in the whole model) and in NCHW
    when it is a graph input (a part's), and the sensitive node at its end then sums in another
    order; a Conv's output is NCHWc either way, so the chain is checked up to the next Conv."""
    sensitive: Dict[str, bool] = {}

    def reaches(t: str) -> bool:
        return any(r.op_type not in LAYOUT_FREE or r.domain not in ("", "ai.onnx")
                   or (r.op_type != "Conv" and any(sensitive.get(o, False) for o in r.output if o))
                   for r in readers.get(t, ()))

    for n in reversed(nodes):
        for o in n.output:
            if o:
                sensitive[o] = reaches(o)
    for t in readers:
        if t not in sensitive:
            sensitive[t] = reaches(t)
    return {t for t, v in sensitive.items() if v}


def _sub_model(model: onnx.ModelProto, nodes, inputs: Sequence[str], outputs: Sequence[str], infos) -> onnx.ModelProto:
    """The nodes ``nodes`` of ``model`` as a model of their own: ``inputs`` in, ``outputs`` out."""
    g = model.graph
    reads = {i for n in nodes for i in n.input if i}
    made = {o for n in nodes for o in n.output if o}
    declared = {i.name: i for i in list(g.input) + list(g.output)}

    def value_info(t: str, shaped: bool) -> onnx.ValueInfoProto:
        """``shaped``: with the inferred shape (a part's inputs: onnxruntime's layout choices need the
        shapes the whole model's inference gives them); else as the model declares it."""
        info = infos.get(t)
        if shaped and info is not None and info.shape is not None and all(d >= 0 for d in info.shape):
            return helper.make_tensor_value_info(t, info.elem_type, info.shape)
        if t in declared and declared[t].type.HasField("tensor_type") and declared[t].type.tensor_type.elem_type:
            return declared[t]
        if info is None:
            return helper.make_empty_tensor_value_info(t)
        return helper.make_tensor_value_info(t, info.elem_type, None)

    sub = helper.make_graph(list(nodes), g.name, [value_info(t, True) for t in inputs], [value_info(t, False) for t in outputs],
                            [t for t in g.initializer if t.name in reads],
                            value_info=[v for v in g.value_info if v.name in made and v.name not in outputs])
    m = helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    m.functions.extend(model.functions)
    return m
