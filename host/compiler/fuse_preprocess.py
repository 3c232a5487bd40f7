"""Compile an image input's Preprocess into the BPU subgraph that reads it.

The board's Preprocess turns input_type_rt data (uint8, input_layout_rt) into
the quantized model's input (int8 = uint8 - 128, in the model's layout). Done
as its own step, it is one more pass over every frame outside the compiled
pieces (about 7% of a small CNN's frame). When the only reader of the input is
one BPU subgraph, and inside it only DequantizeLinear nodes read it, the
subgraph can take the uint8 data itself:

    DequantizeLinear(x_int8, s, zp)  ==  DequantizeLinear(x_uint8, s, zp + 128)

exactly (the integer difference is the same before the one multiply), and the
layout change becomes Transpose nodes on the uint8 data at the subgraph's
start. NHWC -> NCHW of 3 channels is done in two passes (``layout_nodes``):
onnxruntime moves a 3-wide axis one byte at a time, three strided passes over
the frame (40-80 us of a 224x224 frame), but transposes 8-wide blocks with
vector instructions, so the pixels are taken in rows of 16 (16 x 3 bytes, then
16 wide), the same bytes in the end. The Preprocess step stays in the plan,
under the profiler's name, flagged ``fused_into_subgraph``: it checks the
input and passes it on. nv12 (chroma upsampling) and featuremap inputs keep
the separate step.
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
#: The names of the nodes doing an input's layout change end with this (``layout_nodes``).
LAYOUT_SUFFIX = "_Preprocess_layout"
#: Pixels per row in the two-pass NHWC -> NCHW (onnxruntime's vector transpose takes 8 x 8 byte blocks).
_ROW_PIXELS = (16, 8)


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
        layout, shapes = layout_nodes(rt_name, source, rt_shape(spec), perm, f"{name}{LAYOUT_SUFFIX}")
        nodes[:0] = layout
        g.initializer.extend(shapes)
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


def layout_nodes(src: str, dst: str, shape, perm, name: str):
    """(nodes, initializers) writing ``src`` (uint8, ``shape``) transposed by ``perm`` into ``dst``: one
    Transpose node called ``name``, or for NHWC -> NCHW of several channels, where the pixel count allows,
    two passes that onnxruntime runs with vector instructions: (N, P/r, r*C) -> (N, r*C, P/r), seen as
    (N, r, C*P/r) -> (N, C*P/r, r) = (N, C, P), with P = H*W pixels taken in rows of r. The last node
    is called ``name`` and writes ``dst``; the others' names start with it."""
    n, h, w, c = (int(d) for d in shape)
    rows = next((r for r in _ROW_PIXELS if (h * w) % r == 0), None)
    if list(perm) != _TO_MODEL[("NHWC", "NCHW")] or c < 2 or rows is None:
        return [helper.make_node("Transpose", [src], [dst], perm=list(perm), name=name)], []
    p = h * w
    dims = {"in": [n, p // rows, rows * c], "mid": [n, rows, c * p // rows], "out": [n, c, h, w]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), f"{name}_{k}_shape") for k, v in dims.items()]
    t = [f"{name}_{i}" for i in range(4)]
    nodes = [
        helper.make_node("Reshape", [src, inits[0].name], [t[0]], name=f"{name}_rows"),
        helper.make_node("Transpose", [t[0]], [t[1]], perm=[0, 2, 1], name=f"{name}_pass1"),
        helper.make_node("Reshape", [t[1], inits[1].name], [t[2]], name=f"{name}_regroup"),
        helper.make_node("Transpose", [t[2]], [t[3]], perm=[0, 2, 1], name=f"{name}_pass2"),
        helper.make_node("Reshape", [t[3], inits[2].name], [dst], name=name),
    ]
    return nodes, inits


def one_transpose_view(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with an input's two-pass layout change (``layout_nodes``) shown as the one Transpose it
    computes: what the X5 does in one move, and costs as one (the compiler's timing model)."""
    nodes = list(model.graph.node)
    chains = {n.name: n for n in nodes if n.name.endswith(LAYOUT_SUFFIX) and n.op_type == "Reshape"}
    if not chains:
        return model
    view = onnx.ModelProto()
    view.CopyFrom(model)
    kept = []
    for n in view.graph.node:
        end = next((c for c in chains if n.name.startswith(c)), None)
        if end is None:
            kept.append(n)
        elif n.name == end:
            first = next(m for m in nodes if m.name == f"{end}_rows")
            kept.append(helper.make_node("Transpose", [first.input[0]], [n.output[0]], perm=_TO_MODEL[("NHWC", "NCHW")], name=end))
    del view.graph.node[:]
    view.graph.node.extend(kept)
    return view
