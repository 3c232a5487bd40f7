"""The conversion's node table: one row per node, the columns the march's flow logs.

The placement (bpuemu.host.compiler.placement) gives Node, ON, Subgraph and
Type; this module adds the columns after them, from one place for the log
table and (J6) ``*_node_info.csv``:

* X5 (``hb_mapper makertbin``): ``Cosine Similarity``, ``Threshold``.
* J6 (``hb_compile``): ``Output Data Type`` (read from the quantized model and
  the placement: the type of the QuantizeLinear after a BPU node's output,
  the march's tail output type for a model-tail Conv that outputs at high
  accuracy, the tensor's own type otherwise), ``Calibrated Cosine`` (the node
  cosine of the calibrated against the float model) and ``Threshold``.
"""
from typing import Dict, List, Optional

import onnx

from bpuemu.common.march import March
from bpuemu.host.compiler.optable import BPU_OPS
from bpuemu.host.onnxgraph import Q, GraphIndex

#: ONNX elem types as the node table names them.
_DTYPE = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.INT8: "int8",
          onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT16: "int16", onnx.TensorProto.UINT16: "uint16",
          onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT64: "int64", onnx.TensorProto.BOOL: "bool",
          onnx.TensorProto.DOUBLE: "float64"}
J6_COLUMNS = ("Output Data Type", "Calibrated Cosine", "Threshold")


def _elem_types(model: onnx.ModelProto) -> Dict[str, int]:
    g = model.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def output_dtypes(placement, quantized: onnx.ModelProto, march: March) -> Dict[str, str]:
    """Node name -> the data type its first output has on the board (see the module docstring)."""
    if not any(vi.name for vi in quantized.graph.value_info):
        quantized = onnx.shape_inference.infer_shapes(quantized)
    idx = GraphIndex(quantized)
    types = _elem_types(quantized)
    on = {p.name: p.on for p in placement.nodes}

    def quantized_as(t: str) -> Optional[str]:
        q = next((r for r in idx.readers(t) if r.op_type == Q), None)
        if q is None:
            return None
        zp = q.input[2] if len(q.input) > 2 and q.input[2] else ""
        return _DTYPE.get(types.get(zp, onnx.TensorProto.UINT8), "int8")

    out = {}
    for p in placement.nodes:
        node = idx.by_name.get(p.name)
        if node is None or not node.output:
            out[p.name] = "--"
            continue
        t = node.output[0]
        dtype = quantized_as(t) if p.on == "BPU" else None
        if dtype is None and p.on == "BPU":
            # A BPU node fused with the BPU op after it (Conv + Relu) outputs what that op outputs.
            readers = idx.readers(t)
            if len(readers) == 1 and on.get(readers[0].name) == "BPU" and readers[0].output:
                dtype = quantized_as(readers[0].output[0])
        if dtype is None and p.on == "BPU" and BPU_OPS.get(p.op_type) and BPU_OPS[p.op_type].int32_output:
            dtype = march.tail_output_dtype   # the model-tail Conv's high-accuracy output
        out[p.name] = dtype or _DTYPE.get(types.get(t, 0), "float32")
    return out


def node_columns(placement, quantized: onnx.ModelProto, cosines: Dict[str, float], thresholds: Dict[str, float],
                 march: March) -> Dict[str, List[str]]:
    """The columns after Node, ON, Subgraph and Type, by the march's flow."""
    nodes = placement.nodes
    cos = [f"{cosines[n.name]:.6f}" if n.name in cosines else "--" for n in nodes]
    thr = [f"{thresholds[n.name]:.6f}" if n.name in thresholds else "--" for n in nodes]
    if not march.is_j6:
        return {"Cosine Similarity": cos, "Threshold": thr}
    dtypes = output_dtypes(placement, quantized, march)
    return {"Output Data Type": [dtypes[n.name] for n in nodes], "Calibrated Cosine": cos, "Threshold": thr}
