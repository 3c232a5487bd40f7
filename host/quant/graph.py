"""The quantizer's view of a model: the normalized float model, a QDQ model read back
(``strip_qdq``), and the tensors accuracy is measured at.

Graph indexing, opsets and sessions come from the ONNX graph toolkit
(bpuemu.host.onnxgraph); every model the quantizer evaluates runs in a session
it opens with the board runtime's options (QDQ fusion off), the way the board
runtime runs the `.bin` (DESIGN.md, "Numerical contract").
"""
import copy
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from bpuemu.common.numerics import dequantize
from bpuemu.host.onnxgraph import (
    DQ, Q, GraphIndex, attr, constants_to_initializers, convert_opset, map_samples, name_nodes, open_session, tensor_infos,
    with_outputs,
)

MIN_OPSET = 13
INT16_OPSET = 21  # QuantizeLinear/DequantizeLinear take int16 from opset 21 on


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

def float_outputs(model: onnx.ModelProto, samples: Sequence[Mapping[str, np.ndarray]]) -> List[List[np.ndarray]]:
    return map_samples(open_session(model), None, samples)


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
    return names, map_samples(open_session(with_outputs(model, names), arena="shared"), names, samples)
