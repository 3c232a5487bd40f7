"""A model's execution plan read as a dataflow graph: tensors, producers, consumers, pieces.

The plan (proto ``Model.plan``) is a list of steps over a table of named
tensors. The tools need more than the list: the dtype and shape of every
tensor (hb_model_modifier writes them into TensorProperties, hb_perf turns
them into DDR bytes), which step makes a tensor and which steps read it
(adjacency to a model input or output), and the ONNX graph of each piece.

Layout-convert steps rewrite a tensor in place under the same name; they are
the runtime's bookkeeping between BPU and CPU, not nodes of the model, so
they are transparent here: they neither produce nor consume a tensor.
"""
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import helper

from bpuemu.common.errors import InvalidModelFile
from bpuemu.common.input_types import preprocess_output_type
from bpuemu.common.proto import model_pb2

Kind = model_pb2.PlanStep
Q, DQ = "QuantizeLinear", "DequantizeLinear"
#: Steps that run an ONNX piece.
PIECE_KINDS = (Kind.BPU_SUBGRAPH, Kind.CPU_OP, Kind.QUANTIZE)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: np.dtype
    shape: Tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


def np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def value_shape(vi: onnx.ValueInfoProto) -> Tuple[int, ...]:
    return tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)


@lru_cache(maxsize=32)
def _parse(blob: bytes) -> onnx.ModelProto:
    try:
        model = onnx.load_from_string(blob)
    except Exception as exc:  # DecodeError and friends: the file is bad, not our code
        raise InvalidModelFile(f"a piece of the model is not a readable ONNX graph ({type(exc).__name__})") from None
    return onnx.shape_inference.infer_shapes(model)


def piece_model(blob: bytes) -> onnx.ModelProto:
    """The ONNX model of a piece, shape-inferred (cached; do not mutate, copy first)."""
    return _parse(blob)


def piece_tensors(model: onnx.ModelProto) -> Dict[str, onnx.ValueInfoProto]:
    g = model.graph
    return {vi.name: vi for vi in list(g.value_info) + list(g.input) + list(g.output)}


class PlanView:
    """Dataflow over one model's plan. Build it again after changing the plan."""

    def __init__(self, model: model_pb2.Model, blobs: Dict[str, bytes]):
        self.model = model
        self.blobs = blobs
        self.steps: List[model_pb2.PlanStep] = list(model.plan)
        self.tensors: Dict[str, TensorInfo] = {}
        self.producer: Dict[str, int] = {}
        self.consumers: Dict[str, List[int]] = {}
        for i, step in enumerate(self.steps):
            if step.kind == Kind.LAYOUT_CONVERT:
                self._layout(step)
                continue
            for t in step.inputs:
                self.consumers.setdefault(t, []).append(i)
            for t in step.outputs:
                self.producer[t] = i
            self._record_outputs(step)
        #: plan tensor -> index of the model input it carries
        self.input_tensors: Dict[str, int] = {}
        for i, spec in enumerate(model.input_specs):
            self.input_tensors[spec.plan_tensor] = i
        outs = list(model.output_tensors) or [p.name for p in model.outputs]
        #: plan tensor -> indices of the model outputs it is
        self.output_tensors: Dict[str, List[int]] = {}
        for i, t in enumerate(outs):
            self.output_tensors.setdefault(t, []).append(i)

    # --- tensor table ------------------------------------------------------
    def _record_outputs(self, step: model_pb2.PlanStep) -> None:
        if step.kind == Kind.PREPROCESS:
            dtype, shape = preprocess_output_type(self.model.input_specs[step.input_index], step.fused_into_subgraph)
            self.tensors[step.outputs[0]] = TensorInfo(step.outputs[0], dtype, shape)
        elif step.kind in PIECE_KINDS:
            vis = piece_tensors(self.piece(step))
            for t in step.outputs:
                vi = vis.get(t)
                if vi is None:
                    raise InvalidModelFile(f"step '{step.name}': its piece does not produce '{t}'")
                self.tensors[t] = TensorInfo(t, np_dtype(vi.type.tensor_type.elem_type), value_shape(vi))
        elif step.kind == Kind.DEQUANTIZE:
            src = self.tensors.get(step.inputs[0])
            shape = src.shape if src is not None else ()
            self.tensors[step.outputs[0]] = TensorInfo(step.outputs[0], np.dtype("float32"), shape)

    def _layout(self, step: model_pb2.PlanStep) -> None:
        if not step.perm:
            return
        for src, dst in zip(step.inputs, step.outputs):
            t = self.tensors.get(src)
            if t is not None:
                self.tensors[dst] = TensorInfo(dst, t.dtype, tuple(t.shape[p] for p in step.perm))

    # --- queries -----------------------------------------------------------
    def piece(self, step: model_pb2.PlanStep) -> onnx.ModelProto:
        try:
            return piece_model(self.blobs[step.blob])
        except KeyError:
            raise InvalidModelFile(f"step '{step.name}' names missing blob '{step.blob}'") from None

    def step_index(self, name: str) -> Optional[int]:
        for i, s in enumerate(self.steps):
            if s.name == name:
                return i
        return None

    def readers(self, tensor: str) -> List[int]:
        return self.consumers.get(tensor, [])

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise InvalidModelFile(f"the plan never produces tensor '{name}'") from None

    def successors(self, index: int) -> List[int]:
        out = []
        for t in self.steps[index].outputs:
            out.extend(c for c in self.readers(t) if c not in out)
        return out

    def predecessors(self, index: int) -> List[int]:
        out = []
        for t in self.steps[index].inputs:
            p = self.producer.get(t)
            if p is not None and p not in out:
                out.append(p)
        return out


def core_nodes(model: onnx.ModelProto) -> List[onnx.NodeProto]:
    """The piece's nodes that are not the QuantizeLinear/DequantizeLinear around them."""
    return [n for n in model.graph.node if n.op_type not in (Q, DQ)]


def attribute(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def initializer(model: onnx.ModelProto, name: str) -> Optional[np.ndarray]:
    from onnx import numpy_helper

    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    return None


def qparams(model: onnx.ModelProto, node: onnx.NodeProto) -> Tuple[List[float], List[int], int]:
    """(scale, zero_point, axis) of a QuantizeLinear/DequantizeLinear in ``model``; axis -1 per tensor."""
    scale = initializer(model, node.input[1])
    if scale is None:
        raise InvalidModelFile(f"node '{node.name}': scale '{node.input[1]}' is not a constant")
    zp = initializer(model, node.input[2]) if len(node.input) > 2 and node.input[2] else None
    scale = scale.reshape(-1).astype(np.float32)
    zp = np.zeros(1, np.int64) if zp is None else zp.reshape(-1).astype(np.int64)
    axis = int(attribute(node, "axis", 1)) if scale.size > 1 else -1
    return scale.tolist(), zp.tolist(), axis


def names(steps: Sequence[model_pb2.PlanStep]) -> List[str]:
    return [s.name for s in steps]
