"""Compile an image input's Preprocess into the BPU subgraph that reads it.

The board's Preprocess turns input_type_rt data (uint8, input_layout_rt) into
the quantized model's input (int8 = uint8 - 128, in the model's layout). Done
as its own step, it is one more pass over every frame outside the compiled
pieces (about 7% of a small CNN's frame). When the only reader of the input is
one BPU subgraph, and inside it only DequantizeLinear nodes read it, the
subgraph can take the uint8 data itself:

    DequantizeLinear(x_int8, s, zp)  ==  DequantizeLinear(x_uint8, s, zp + 128)

exactly (the integer difference is the same before the one multiply), and the
layout change becomes a Transpose node on the uint8 data at the subgraph's
start, where onnxruntime does it about twice as fast as numpy. The Preprocess
step stays in the plan, under the profiler's name, flagged
``fused_into_subgraph``: it checks the input and passes it on. nv12 (chroma
upsampling) and featuremap inputs keep the separate step.
"""
from typing import Dict, List, Optional

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bpuemu.common.input_types import FUSABLE_RT_TYPES, rt_shape
from bpuemu.common.proto import model_pb2

Kind = model_pb2.PlanStep
DQ = "DequantizeLinear"
_TO_MODEL = {("NHWC", "NCHW"): [0, 3, 1, 2], ("NCHW", "NHWC"): [0, 2, 3, 1]}


def fuse_preprocess(plan: List[model_pb2.PlanStep], blobs: Dict[str, bytes],
                    specs: List[model_pb2.InputSpec], output_tensors: List[str]) -> List[str]:
    """Fuse every input's Preprocess that can be into its reader (in place); returns the inputs fused."""
    fused = []
    for index, spec in enumerate(specs):
        if spec.input_type_rt not in FUSABLE_RT_TYPES or spec.plan_tensor in output_tensors:
            continue
        pre = next((s for s in plan if s.kind == Kind.PREPROCESS and s.input_index == index), None)
        readers = [s for s in plan if spec.plan_tensor in s.inputs]
        if pre is None or len(readers) != 1 or readers[0].kind != Kind.BPU_SUBGRAPH:
            continue
        reader = readers[0]
        rt_name = pre.inputs[0]
        piece = fused_piece(blobs[reader.blob], spec, rt_name)
        if piece is None:
            continue
        blobs[reader.blob] = piece
        reader.inputs[list(reader.inputs).index(spec.plan_tensor)] = rt_name
        pre.outputs[0] = rt_name
        pre.fused_into_subgraph = True
        fused.append(spec.name)
    return fused


def fused_piece(blob: bytes, spec: model_pb2.InputSpec, rt_name: str) -> Optional[bytes]:
    """The piece ``blob`` reading ``rt_name`` (uint8 rt data) instead of the int8 model input; None if it cannot."""
    m = onnx.load_from_string(blob)
    g = m.graph
    name = spec.plan_tensor
    readers = [n for n in g.node if name in n.input]
    if not readers or any(n.op_type != DQ or n.input[0] != name or list(n.input).count(name) != 1 for n in readers):
        return None
    inits = {t.name: t for t in g.initializer}
    zero_points = []
    for n in readers:
        zp_name = n.input[2] if len(n.input) > 2 else ""
        if zp_name and zp_name not in inits:
            return None  # a computed zero point: leave it alone
        zp = numpy_helper.to_array(inits[zp_name]) if zp_name else np.zeros((), np.int8)
        if zp.dtype != np.int8:
            return None
        zero_points.append(zp)

    source = rt_name
    perm = _TO_MODEL.get((spec.input_layout_rt, spec.model_layout))
    nodes = list(g.node)
    if perm is not None:
        source = f"{name}__from_rt"
        nodes.insert(0, helper.make_node("Transpose", [rt_name], [source], perm=perm, name=f"{name}_Preprocess_layout"))
    for n, zp in zip(readers, zero_points):
        shifted = numpy_helper.from_array((zp.astype(np.int16) + 128).astype(np.uint8), f"{n.name}__rt_zero_point")
        g.initializer.append(shifted)
        n.input[0] = source
        if len(n.input) > 2:
            n.input[2] = shifted.name
        else:
            n.input.append(shifted.name)
    used = {i for n in nodes for i in n.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    del g.node[:]
    g.node.extend(nodes)
    for vi in g.input:
        if vi.name == name:
            vi.CopyFrom(helper.make_tensor_value_info(rt_name, TensorProto.UINT8, list(rt_shape(spec))))
    return m.SerializeToString()
