"""ONNX graph helpers of the quantizer: normalizing the float model, reading a QDQ model,
running models with the runtime's session options, cosine similarity.

Every model the quantizer evaluates runs with
``bpuemu.board.runtime.sessions.session_options()`` (QDQ fusion off), the way
the board runtime runs the `.bin` (DESIGN.md, "Numerical contract").
"""
import copy
import logging
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bpuemu.common.errors import InvalidInput
from bpuemu.common.numerics import dequantize
from bpuemu.common.tensor import ORT_DTYPES

log = logging.getLogger("bpuemu.host.quant")

MIN_OPSET = 13
INT16_OPSET = 21  # QuantizeLinear/DequantizeLinear take int16 from opset 21 on
Q, DQ = "QuantizeLinear", "DequantizeLinear"


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def convert_opset(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """onnx.version_converter to ``target`` (no-op when already there); raises InvalidInput."""
    if default_opset(model) >= target:
        return model
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, target)
    except Exception as exc:  # the converter raises several internal types
        raise InvalidInput(f"cannot convert the model from opset {default_opset(model)} to {target}: {exc}") from None
    converted.ir_version = max(converted.ir_version, helper.find_min_ir_version_for(list(converted.opset_import), True))
    return converted


def constants_to_initializers(model: onnx.ModelProto) -> None:
    """Constant nodes -> initializers, so weights held as Constant are seen as weights."""
    g = model.graph
    keep = []
    for n in g.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.output[0] not in {o.name for o in g.output}:
            a = n.attribute[0]
            value = helper.get_attribute_value(a)
            if a.name == "value":
                arr = numpy_helper.to_array(value)
            elif a.name in ("value_float", "value_int"):
                arr = np.array(value, dtype=np.float32 if a.name == "value_float" else np.int64)
            elif a.name in ("value_floats", "value_ints"):
                arr = np.array(value, dtype=np.float32 if a.name == "value_floats" else np.int64)
            else:
                keep.append(n)
                continue
            g.initializer.append(numpy_helper.from_array(arr, n.output[0]))
        else:
            keep.append(n)
    if len(keep) != len(g.node):
        del g.node[:]
        g.node.extend(keep)


def name_nodes(model: onnx.ModelProto) -> None:
    """Name unnamed nodes ``<op_type>_<index>`` as the placement stage does."""
    for i, n in enumerate(model.graph.node):
        if not n.name:
            n.name = f"{n.op_type}_{i}"


def has_qdq(model: onnx.ModelProto) -> bool:
    return any(n.op_type in (Q, DQ) for n in model.graph.node)


def prepare_model(model: onnx.ModelProto, min_opset: int = MIN_OPSET) -> onnx.ModelProto:
    """A normalized copy of the float model: Constant nodes folded into
    initializers, opset >= ``min_opset``, every node named. Deterministic, so
    calibrate() and the build functions see the same names."""
    m = copy.deepcopy(model)
    constants_to_initializers(m)
    m = convert_opset(m, min_opset)
    constants_to_initializers(m)  # the converter may add Constant nodes
    name_nodes(m)
    return m


@dataclass
class TensorInfo:
    elem_type: int
    shape: Optional[List[int]]  # None when unknown; dims <= 0 are symbolic

    @property
    def is_float(self) -> bool:
        return self.elem_type == TensorProto.FLOAT


def tensor_infos(model: onnx.ModelProto) -> Dict[str, TensorInfo]:
    """Type and shape of every tensor shape inference knows."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # inference errors have several types
        log.debug("shape inference failed (%s); using declared types only", exc)
        inferred = model
    out: Dict[str, TensorInfo] = {}
    g = inferred.graph
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        t = vi.type.tensor_type
        if not t.elem_type:
            continue
        shape = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim] if t.HasField("shape") else None
        out[vi.name] = TensorInfo(t.elem_type, shape)
    for init in g.initializer:
        out[init.name] = TensorInfo(init.data_type, list(init.dims))
    return out


class GraphIndex:
    """Producer/consumer maps of a graph."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.model = model
        self.nodes = list(g.node)
        self.by_name = {n.name: n for n in self.nodes}
        self.inits = {t.name: t for t in g.initializer}
        self.inputs = [i.name for i in g.input if i.name not in self.inits]
        self.outputs = [o.name for o in g.output]
        self.producer: Dict[str, onnx.NodeProto] = {}
        self.consumers: Dict[str, List[Tuple[onnx.NodeProto, int]]] = {}
        for n in self.nodes:
            for o in n.output:
                if o:
                    self.producer[o] = n
            for k, i in enumerate(n.input):
                if i:
                    self.consumers.setdefault(i, []).append((n, k))

    def const(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.inits[name])


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


# --- reading a QDQ model (calibration_type: load) ------------------------------------------

@dataclass
class LoadedQuant:
    """Q/DQ parameters read from a QDQ model."""

    scale: np.ndarray
    zero_point: np.ndarray
    dtype: str
    axis: Optional[int]


@dataclass
class LoadedWeight:
    quantized: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray
    axis: Optional[int]


def strip_qdq(model: onnx.ModelProto) -> Tuple[onnx.ModelProto, Dict[str, LoadedQuant], Dict[str, LoadedWeight]]:
    """A QDQ model (QAT export, onnxruntime quantize_static) -> its float model and the
    quantization parameters of its activations and weights, keyed by the float
    model's tensor names.

    Each QuantizeLinear -> DequantizeLinear pair is removed and its consumers
    read the float tensor again; a DequantizeLinear of an integer initializer
    becomes a float initializer (named without the ``_quantized`` suffix when
    that name is free). A DequantizeLinear that produced a graph output gives
    its name back to the float tensor.
    """
    s = _QdqStripper(copy.deepcopy(model))
    s.read_dequantize_nodes()
    s.read_quantize_nodes()
    kept = [n for n in s.idx.nodes if (n.name or id(n)) not in s.drop]
    s.rewire(kept)
    s.keep_output_names(kept)
    s.prune(kept)
    return s.model, s.loaded, s.weights


class _QdqStripper:
    """The state strip_qdq's passes share; each pass is one method, run in the order above."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.idx = GraphIndex(model)
        self.names_in_use = set(self.idx.inits) | set(self.idx.producer) | set(self.idx.inputs)
        self.alias: Dict[str, str] = {}      # DQ output -> float tensor it stands for
        self.loaded: Dict[str, LoadedQuant] = {}
        self.weights: Dict[str, LoadedWeight] = {}
        self.new_inits: List[TensorProto] = []
        self.drop = set()                    # nodes to remove (name, or id() when unnamed)

    def params(self, node) -> Tuple[np.ndarray, np.ndarray, Optional[int]]:
        scale = self.idx.const(node.input[1]).astype(np.float32)
        if len(node.input) > 2 and node.input[2]:
            zp = self.idx.const(node.input[2])
        else:
            zp = np.zeros(scale.shape, np.uint8)
        axis = attr(node, "axis", 1) if scale.size > 1 else None
        return scale, zp, axis

    def loaded_quant(self, node) -> LoadedQuant:
        scale, zp, axis = self.params(node)
        shape = (-1,) if axis is not None else ()
        return LoadedQuant(scale.reshape(shape), zp.reshape(shape), np.dtype(zp.dtype).name, axis)

    def _replace(self, node, output_of: str) -> None:
        """``node`` goes; its output stands for ``output_of``."""
        self.alias[node.output[0]] = output_of
        self.drop.add(node.name or id(node))

    def read_dequantize_nodes(self) -> None:
        """Weights become float initializers; Q -> DQ pairs and integer model inputs are read."""
        idx = self.idx
        for n in idx.nodes:
            if n.op_type != DQ:
                continue
            src = n.input[0]
            if src in idx.inits:
                self._float_weight(n)
                continue
            p = idx.producer.get(src)
            if p is not None and p.op_type == Q:
                self.loaded[p.input[0]] = self.loaded_quant(n)
                self._replace(n, p.input[0])
            elif src in idx.inputs:
                # An integer model input: the float model reads it as float.
                for vi in self.model.graph.input:
                    if vi.name == src:
                        vi.type.tensor_type.elem_type = TensorProto.FLOAT
                self.loaded[src] = self.loaded_quant(n)
                self._replace(n, src)

    def _float_weight(self, n) -> None:
        src = n.input[0]
        scale, zp, axis = self.params(n)
        q = self.idx.const(src)
        value = dequantize(q, scale, zp, axis if axis is not None else 1)
        base = src[: -len("_quantized")] if src.endswith("_quantized") else n.output[0]
        if base != n.output[0] and base in self.names_in_use:
            base = n.output[0]
        self.names_in_use.add(base)
        self.new_inits.append(numpy_helper.from_array(value, base))
        self.weights[base] = LoadedWeight(q, scale.reshape(-1), zp.reshape(-1), axis)
        self._replace(n, base)

    def read_quantize_nodes(self) -> None:
        """Every QuantizeLinear goes; one producing a graph output (an int8 model output)
        hands that output to the float tensor."""
        for n in self.idx.nodes:
            if n.op_type == Q:
                self.drop.add(n.name or id(n))
                if n.output[0] in self.idx.outputs:
                    self.alias[n.output[0]] = n.input[0]
                    self.loaded.setdefault(n.input[0], self.loaded_quant(n))

    def resolve(self, t: str) -> str:
        seen = set()
        while t in self.alias and t not in seen:
            seen.add(t)
            t = self.alias[t]
        return t

    def rewire(self, kept) -> None:
        """Consumers read the float tensors again."""
        for n in kept:
            for k, i in enumerate(n.input):
                if i in self.alias:
                    n.input[k] = self.resolve(i)

    def keep_output_names(self, kept) -> None:
        """Graph outputs keep their names: rename the float tensor behind each one."""
        idx = self.idx
        renames: Dict[str, str] = {}
        for o in self.model.graph.output:
            if o.name in self.alias:
                src = self.resolve(o.name)
                if src in idx.inputs or src in self.names_in_use and src not in idx.producer:
                    continue
                renames[src] = o.name
                o.type.tensor_type.elem_type = TensorProto.FLOAT
        for n in kept:
            for k, o in enumerate(n.output):
                if o in renames:
                    n.output[k] = renames[o]
            for k, i in enumerate(n.input):
                if i in renames:
                    n.input[k] = renames[i]
        for old, new in renames.items():
            if old in self.loaded:
                self.loaded[new] = self.loaded.pop(old)

    def prune(self, kept) -> None:
        """Only the kept nodes, the initializers they use, no stale value_info."""
        g = self.model.graph
        del g.node[:]
        g.node.extend(kept)
        used = {i for n in kept for i in n.input} | {o.name for o in g.output}
        new_names = {i.name for i in self.new_inits}
        inits = [t for t in g.initializer if t.name in used and t.name not in new_names]
        inits += [t for t in self.new_inits if t.name in used]
        del g.initializer[:]
        g.initializer.extend(inits)
        del g.value_info[:]
        self.weights = {k: v for k, v in self.weights.items() if k in used}


# --- running models -----------------------------------------------------------------------

def session(model: onnx.ModelProto):
    """An onnxruntime session with the board runtime's options (QDQ fusion off)."""
    import onnxruntime as ort

    from bpuemu.board.runtime.sessions import session_options

    try:
        return ort.InferenceSession(model.SerializeToString(), sess_options=session_options(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's exception types vary by version
        raise InvalidInput(f"onnxruntime cannot load the model: {exc}") from None



def feed_for(sess, sample: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The sample cast to each session input's type (X_128 floats -> int8 for a quantized model)."""
    feed = {}
    for i in sess.get_inputs():
        if i.name not in sample:
            raise InvalidInput(f"calibration sample has no data for input '{i.name}' (has {sorted(sample)})")
        x = np.asarray(sample[i.name])
        dtype = ORT_DTYPES.get(i.type, np.dtype(np.float32))
        if np.issubdtype(dtype, np.integer) and not np.issubdtype(x.dtype, np.integer):
            info = np.iinfo(dtype)
            x = np.clip(np.rint(x), info.min, info.max)
        feed[i.name] = np.ascontiguousarray(x.astype(dtype, copy=False))
    return feed


def with_outputs(model: onnx.ModelProto, tensors: Iterable[str], infos: Optional[Mapping[str, TensorInfo]] = None) -> onnx.ModelProto:
    """A copy of ``model`` that also outputs ``tensors`` (for dumping intermediates)."""
    m = copy.deepcopy(model)
    have = {o.name for o in m.graph.output} | {i.name for i in m.graph.input}
    for t in tensors:
        if t in have:
            continue
        elem = infos[t].elem_type if infos and t in infos else TensorProto.FLOAT
        m.graph.output.append(helper.make_tensor_value_info(t, elem, None))
        have.add(t)
    return m


def float_outputs(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]]) -> List[List[np.ndarray]]:
    sess = session(model)
    return [sess.run(None, feed_for(sess, s)) for s in samples]


def float_source(tensor: str, producer: Mapping[str, onnx.NodeProto], is_float: Callable[[str], bool]) -> str:
    """The tensor accuracy is measured at for ``tensor``: itself when float; for an integer
    tensor (ArgMax indices, where a cosine of indices means nothing) the float tensor it is
    computed from, following its producers' first inputs."""
    seen = set()
    while not is_float(tensor) and tensor in producer and tensor not in seen:
        seen.add(tensor)
        tensor = producer[tensor].input[0]
    return tensor


def scored_tensors(model: onnx.ModelProto) -> List[str]:
    """Per model output (in order), the tensor its accuracy is measured at (``float_source``);
    an integer output computed straight from a model input stays itself."""
    outs = [o.name for o in model.graph.output]
    if all(o.type.tensor_type.elem_type == TensorProto.FLOAT for o in model.graph.output):
        return outs                                    # the usual case: no shape inference needed
    infos = tensor_infos(model)
    idx = GraphIndex(model)

    def is_float(t: str) -> bool:
        info = infos.get(t)
        return info is None or info.is_float

    sources = [float_source(o, idx.producer, is_float) for o in outs]
    return [o if s in idx.inputs or s in idx.inits else s for o, s in zip(outs, sources)]


def scored_outputs(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]]) -> Tuple[List[str], List[List[np.ndarray]]]:
    """``scored_tensors(model)`` and their values on each sample."""
    names = scored_tensors(model)
    sess = session(with_outputs(model, names))
    return names, [sess.run(names, feed_for(sess, s)) for s in samples]
