"""Reading an ONNX model and the graph facts every stage asks for: opset, names, types, shapes.

``load_onnx`` is how every host tool that takes an ``.onnx`` path (hb_mapper
checker / makertbin / infer, HB_ONNXRuntime, hb_verifier, the debugger) reads
it, so a missing, unreadable or non-ONNX file gives the same NotFound /
InvalidInput everywhere instead of a traceback.
"""
import copy
import logging
import os
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.host.onnxgraph.index import DQ, Q

log = logging.getLogger("bpuemu.host.onnxgraph")


def load_onnx(path: str, what: str = "model file", load_external_data: bool = True) -> onnx.ModelProto:
    """The model in ``path``; ``what`` names the file in errors (e.g. "onnx_model", "quantized model")."""
    if not os.path.exists(path):
        raise NotFound(f"{what} not found: {path}")
    if os.path.isdir(path):
        raise InvalidInput(f"{what} {path} is a directory, not an ONNX model")
    try:
        model = onnx.load(path, load_external_data=load_external_data)
    except Exception as exc:  # onnx raises DecodeError, OSError and others
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise InvalidInput(f"{path} is not a readable ONNX model: {type(exc).__name__}"
                           + (f": {detail}" if detail else "")) from None
    if not model.opset_import and not model.graph.node:
        # Another protobuf (a Caffe caffemodel, a .bin's manifest) can parse as an empty ModelProto.
        raise InvalidInput(f"{path} is not an ONNX model: it has no operator set and no graph",
                           hint="a Caffe model is converted with --model-type caffe (--proto NET.prototxt)")
    return model


def graph_inputs(model: onnx.ModelProto) -> List[onnx.ValueInfoProto]:
    """The model's inputs: the graph inputs that are not initializers (older exporters list every
    weight as a graph input too)."""
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def default_opset(model: onnx.ModelProto) -> int:
    """The version of the default (ai.onnx) operator set; 0 when the model imports none."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def convert_opset(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """onnx.version_converter to ``target`` (the model itself when already there); raises InvalidInput."""
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
    """Constant nodes -> initializers, in place, so weights held as Constant are seen as weights."""
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
    """Name unnamed nodes ``<op_type>_<index>``, in place: the names the checker table, the
    calibration and the plan all use."""
    for i, n in enumerate(model.graph.node):
        if not n.name:
            n.name = f"{n.op_type}_{i}"


def has_qdq(model: onnx.ModelProto) -> bool:
    """Whether the model holds QuantizeLinear/DequantizeLinear nodes (a QAT export, a quantized model)."""
    return any(n.op_type in (Q, DQ) for n in model.graph.node)


@dataclass
class TensorInfo:
    elem_type: int
    shape: Optional[List[int]]  # None when unknown; dims <= 0 are symbolic

    @property
    def is_float(self) -> bool:
        return self.elem_type == TensorProto.FLOAT


def elem_type_name(elem_type: int, unknown: str = "float32") -> str:
    """"int32", "float32", "bool", ... for an ONNX element type; ``unknown`` for 0 or a type numpy lacks."""
    if not elem_type:
        return unknown
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except (KeyError, ValueError):
        return unknown


def tensor_infos(model: onnx.ModelProto) -> Dict[str, TensorInfo]:
    """Type and shape of every tensor shape inference knows (the declared ones when it fails)."""
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


def value_infos(model: onnx.ModelProto) -> Dict[str, onnx.ValueInfoProto]:
    """The ValueInfoProto of every non-initializer tensor: inferred intermediates, graph inputs and outputs.

    Shape inference errors propagate: the compiler cannot build a piece whose tensor types are unknown.
    """
    g = model.graph
    inferred = onnx.shape_inference.infer_shapes(model)
    return {vi.name: vi for vi in list(inferred.graph.value_info) + list(g.input) + list(g.output)}


def with_outputs(model: onnx.ModelProto, tensors: Iterable[str],
                 infos: Optional[Mapping[str, TensorInfo]] = None) -> onnx.ModelProto:
    """A copy of ``model`` that also outputs ``tensors`` (for dumping intermediates).

    An added output is typed from ``infos`` when it knows the tensor, else
    float; ``infos=None`` leaves every added output untyped (onnxruntime infers
    the type). Tensors that already are graph inputs or outputs are not added.
    """
    m = copy.deepcopy(model)
    have = {o.name for o in m.graph.output} | {i.name for i in m.graph.input}
    for t in tensors:
        if t in have:
            continue
        if infos is None:
            m.graph.output.append(helper.make_empty_tensor_value_info(t))
        else:
            elem = infos[t].elem_type if t in infos else TensorProto.FLOAT
            m.graph.output.append(helper.make_tensor_value_info(t, elem, None))
        have.add(t)
    return m
