"""hb_model_modifier: remove Quantize/Transpose at the inputs and Transpose/Dequantize/Cast/Reshape/Softmax at the outputs.

This is surgery on the `.bin` manifest: the runtime executes the plan, so a
removed node is a plan step (or a piece) that is no longer there, and the
model's TensorProperties say what the application now hands in or gets back.
What counts as a node (ptq_guide, "hb_model_modifier"):

    input side   ``<node>_HzQuantize`` (QUANTIZE step)          -> "Quantize"
                 a CPU op that is exactly one Transpose           -> "Transpose"
    output side  ``<node>_HzDequantize`` (DEQUANTIZE step)       -> "Dequantize"
                 a CPU op that is exactly one Transpose, Cast,
                 Reshape or Softmax                               -> that type

A node is removable only while it is adjacent to a model input (it reads the
input and nothing else reads it) or output (everything it makes is a model
output that no other step reads); this is checked again before each removal,
so removing a Softmax can make the Dequantize before it removable. Nodes
inside a BPU subgraph are compiled into it and never removable.

Model input and output *names* stay as they were (as the real tool keeps
them); what changes is the tensor the plan reads or leaves there:

* Dequantize removed: the output is the raw int8/int32 tensor, with quanti
  type SCALE and the scale, zero point and quantize axis of the removed node,
  so ``(q - zero_point) * scale`` gives back the float output.
* Quantize removed: the featuremap input takes the quantized tensor (int8,
  SCALE), quantized by the application.
* A CPU op removed: its remaining DequantizeLinear (output side) becomes a
  ``<node>_HzDequantize`` step, its remaining QuantizeLinear (input side) a
  ``<node>_HzQuantize`` step, ready to be removed next.

Each removal is recorded in ``build_info.deleted_nodes`` and, as one JSON line
with the node's initial information, in ``build_info.deleted_nodes_info``.
"""
import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import helper

from bpuemu.common.container import BinFile
from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.common.proto import model_pb2
from bpuemu.common.tensor import LAYOUT, TENSOR_TYPE_OF_DTYPE, make_properties
from bpuemu.host.compiler.plan import (DQ, Q, Kind, PlanView, TensorInfo, attribute, core_nodes, initializer, np_dtype,
                                    piece_tensors, qparams, value_shape)

INPUT_TYPES = ("Quantize", "Transpose")
OUTPUT_TYPES = ("Transpose", "Dequantize", "Cast", "Reshape", "Softmax")
TYPES = ("Quantize", "Transpose", "Dequantize", "Cast", "Reshape", "Softmax")


@dataclass(frozen=True)
class Candidate:
    """A node the plan holds that hb_model_modifier knows how to remove."""

    name: str
    op_type: str
    index: int                  # its plan step
    side: str = ""              # "input" | "output" when adjacent, "" when not


@dataclass
class Removed:
    name: str
    op_type: str
    info: Dict[str, object] = field(default_factory=dict)

    def info_line(self) -> str:
        return json.dumps({"name": self.name, "op_type": self.op_type, **self.info}, sort_keys=False)


class PackedModelNotSupported(InvalidInput):
    """hb_model_modifier refuses files made by hb_pack (the seed's message)."""

    def __init__(self):
        super().__init__("pack model is not supported.")


# --- finding nodes ---------------------------------------------------------

def _step_type(view: PlanView, index: int) -> Optional[str]:
    step = view.steps[index]
    if step.kind == Kind.QUANTIZE:
        return "Quantize"
    if step.kind == Kind.DEQUANTIZE:
        return "Dequantize"
    if step.kind == Kind.CPU_OP:
        core = core_nodes(view.piece(step))
        if len(core) == 1 and core[0].op_type in TYPES and core[0].op_type not in ("Quantize", "Dequantize"):
            return core[0].op_type
    return None


def _side(view: PlanView, index: int, op_type: str) -> str:
    step = view.steps[index]
    if op_type in INPUT_TYPES and step.inputs and all(t in view.input_tensors for t in step.inputs):
        # one path after the input (nothing else reads it), and a featuremap: an image input's
        # form is fixed by its input_type_rt
        if all(view.readers(t) == [index] for t in step.inputs) and _featuremap_input(view, step.inputs[0]):
            return "input"
    if op_type in OUTPUT_TYPES and step.outputs and all(t in view.output_tensors for t in step.outputs):
        if not any(view.readers(t) for t in step.outputs):
            return "output"
    return ""


def _featuremap_input(view: PlanView, tensor: str) -> bool:
    spec = view.model.input_specs[view.input_tensors[tensor]]
    return spec.input_type_rt == "featuremap"


def candidates(model: model_pb2.Model, blobs: Dict[str, bytes]) -> List[Candidate]:
    """Every node of a removable type, adjacent or not, in plan order."""
    view = PlanView(model, blobs)
    out = []
    for i, step in enumerate(view.steps):
        t = _step_type(view, i)
        if t:
            out.append(Candidate(step.name, t, i, _side(view, i, t)))
    return out


def removable_nodes(model: model_pb2.Model, blobs: Dict[str, bytes]) -> List[Candidate]:
    """The nodes that can be deleted now (what ``hb_model_modifier MODEL`` lists)."""
    return [c for c in candidates(model, blobs) if c.side]


# --- removing them -----------------------------------------------------------

def _set_output(model: model_pb2.Model, view: PlanView, old: str, info: TensorInfo, **quant) -> None:
    """Make the plan leave model output(s) ``old`` in tensor ``info.name``; the output names stay."""
    if not model.output_tensors:
        model.output_tensors.extend(p.name for p in model.outputs)
    for i in view.output_tensors[old]:
        model.output_tensors[i] = info.name
        was = model.outputs[i]
        layout = was.tensor_layout if len(info.shape) == 4 else LAYOUT.HB_DNN_LAYOUT_NONE
        model.outputs[i].CopyFrom(make_properties(was.name, info.shape, TENSOR_TYPE_OF_DTYPE[info.dtype], layout, **quant))


def _remove_dequantize(model, view: PlanView, index: int) -> Removed:
    step = view.steps[index]
    src, out = step.inputs[0], step.outputs[0]
    scale, zp = list(step.scale), list(step.zero_point) or [0]
    info = view.tensor(src)
    axis = step.axis if len(scale) > 1 else -1
    if axis < -1:
        axis += len(info.shape)
    del model.plan[index]
    _set_output(model, view, out, info, scale=scale, zero_point=zp, axis=axis)
    return Removed(step.name, "Dequantize", {"input": src, "output": out, "dtype": info.dtype.name,
                                              "scale": scale, "zero_point": zp, "axis": axis})


def _remove_quantize(model, view: PlanView, index: int) -> Removed:
    step = view.steps[index]
    piece = view.piece(step)
    qnodes = [n for n in piece.graph.node if n.op_type == Q]
    if len(qnodes) != 1 or len(piece.graph.node) != 1:
        raise InvalidInput(f"node '{step.name}' quantizes more than one tensor; it can not be removed")
    src, out = step.inputs[0], step.outputs[0]
    scale, zp, axis = qparams(piece, qnodes[0])
    info = view.tensor(out)
    if axis < -1:
        axis += len(info.shape)
    i_input = view.input_tensors[src]
    _retarget_input(model, view, src, out, info.dtype, info.shape, model.input_specs[i_input].model_layout)
    del model.plan[index]
    props = model.inputs[i_input]
    layout = props.tensor_layout
    model.inputs[i_input].CopyFrom(make_properties(props.name, info.shape, TENSOR_TYPE_OF_DTYPE[info.dtype], layout,
                                                   scale=scale, zero_point=zp, axis=axis,
                                                   input_source=props.input_source))
    return Removed(step.name, "Quantize", {"input": src, "output": out, "dtype": info.dtype.name,
                                           "scale": scale, "zero_point": zp, "axis": axis})


def _retarget_input(model, view: PlanView, old: str, new: str, dtype: np.dtype, shape, layout: str) -> None:
    """Have the Preprocess step of the input carried by ``old`` write ``new`` instead."""
    i_input = view.input_tensors[old]
    spec = model.input_specs[i_input]
    spec.plan_tensor = new
    spec.model_dtype = dtype.name
    del spec.model_shape[:]
    spec.model_shape.extend(int(d) for d in shape)
    spec.model_layout = layout if len(shape) == 4 else ""
    for step in model.plan:
        if step.kind == Kind.PREPROCESS and step.input_index == i_input:
            step.outputs[0] = new


def _replace_step(model: model_pb2.Model, index: int, steps: Sequence[model_pb2.PlanStep]) -> None:
    del model.plan[index]
    for k, step in enumerate(steps):
        model.plan.insert(index + k, step)


def _subgraph(piece: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], inputs: Sequence[str],
              outputs: Sequence[str], name: str) -> bytes:
    vis = piece_tensors(piece)
    used = {i for n in nodes for i in n.input}
    inits = [t for t in piece.graph.initializer if t.name in used]
    g = helper.make_graph(list(nodes), name, [vis[i] for i in inputs], [vis[o] for o in outputs], initializer=inits)
    m = helper.make_model(g, opset_imports=list(piece.opset_import), producer_name="bpuemu hb_model_modifier")
    m.ir_version = piece.ir_version
    return m.SerializeToString()


def _op_info(piece: onnx.ModelProto, node: onnx.NodeProto) -> Dict[str, object]:
    info: Dict[str, object] = {}
    for a in node.attribute:
        v = attribute(node, a.name)
        info[a.name] = v.decode() if isinstance(v, bytes) else (list(v) if isinstance(v, (list, tuple)) else v)
    if node.op_type == "Reshape" and len(node.input) > 1:
        shape = initializer(piece, node.input[1])
        if shape is not None:
            info["shape"] = shape.astype(int).tolist()
    if node.op_type == "Cast" and "to" in info:
        info["to"] = onnx.TensorProto.DataType.Name(int(info["to"]))
    return info


def _remove_cpu_op(model, view: PlanView, index: int, op_type: str, side: str, blobs: Dict[str, bytes]) -> Removed:
    step = view.steps[index]
    piece = view.piece(step)
    op = core_nodes(piece)[0]
    vis = piece_tensors(piece)
    info = {"input": op.input[0], "output": op.output[0], **_op_info(piece, op)}
    rest = [n for n in piece.graph.node if n.name != op.name]
    producers = {o: n for n in rest for o in n.output}
    new_steps: List[model_pb2.PlanStep] = []
    not_single = InvalidInput(f"node '{step.name}' is not a single {op_type}; it can not be removed")
    if side == "output":
        # The op's data input: made by a DequantizeLinear in the piece, or a float tensor from outside.
        feeding = producers.get(op.input[0])
        if list(step.outputs) != [op.output[0]] or any(feeding is None or n.name != feeding.name for n in rest):
            raise not_single
        if feeding is not None:
            if feeding.op_type != DQ or feeding.input[0] not in step.inputs:
                raise not_single
            scale, zp, axis = qparams(piece, feeding)
            new_steps.append(model_pb2.PlanStep(
                kind=Kind.DEQUANTIZE, name=f"{feeding.name}_HzDequantize", inputs=[feeding.input[0]],
                outputs=[feeding.output[0]], scale=scale, zero_point=zp, axis=max(axis, 0) if len(scale) > 1 else 1,
                source_nodes=[feeding.name]))
        vi = vis[op.input[0]]
        new_out = TensorInfo(op.input[0], np_dtype(vi.type.tensor_type.elem_type), value_shape(vi))
        _replace_step(model, index, new_steps)
        _set_output(model, view, step.outputs[0], new_out)
        return Removed(step.name, op_type, info)

    # input side: the op reads the model input; what follows it in the piece (QuantizeLinear) stays
    src = step.inputs[0]
    new_in = op.output[0]
    readers = [n for n in rest if new_in in n.input]
    if list(step.inputs) != [op.input[0]] or any(n.op_type != Q or new_in not in n.input for n in rest):
        raise not_single
    vi = vis[new_in]
    shape, dtype = value_shape(vi), np_dtype(vi.type.tensor_type.elem_type)
    i_input = view.input_tensors[src]
    spec = model.input_specs[i_input]
    layout = spec.model_layout
    perm = tuple(attribute(op, "perm", ()) or ())
    if op_type == "Transpose" and len(shape) == 4:
        layout = {("NCHW", (0, 2, 3, 1)): "NHWC", ("NHWC", (0, 3, 1, 2)): "NCHW"}.get((layout, perm), "")
    _retarget_input(model, view, src, new_in, dtype, shape, layout)
    for qn in readers:
        name = f"{qn.name}_HzQuantize"
        blob = f"{step.blob}.{qn.name}"
        blobs[blob] = _subgraph(piece, [qn], [new_in], [qn.output[0]], name)
        new_steps.append(model_pb2.PlanStep(kind=Kind.QUANTIZE, name=name, inputs=[new_in], outputs=[qn.output[0]],
                                            blob=blob, op_types=[Q], source_nodes=[qn.name]))
    _replace_step(model, index, new_steps)
    props = model.inputs[i_input]
    tl = {"NCHW": LAYOUT.HB_DNN_LAYOUT_NCHW, "NHWC": LAYOUT.HB_DNN_LAYOUT_NHWC}.get(layout, LAYOUT.HB_DNN_LAYOUT_NONE)
    model.inputs[i_input].CopyFrom(make_properties(props.name, shape, TENSOR_TYPE_OF_DTYPE[dtype], tl,
                                                   input_source=props.input_source))
    return Removed(step.name, op_type, info)


def remove_node(model: model_pb2.Model, blobs: Dict[str, bytes], name: str) -> Removed:
    """Remove node ``name`` from ``model`` (in place; ``blobs`` gains any new piece).

    Raises NotFound for a name that is no removable-type node, InvalidInput for
    one that is not adjacent to a model input or output.
    """
    found = next((c for c in candidates(model, blobs) if c.name == name), None)
    if found is None:
        view = PlanView(model, blobs)
        if view.step_index(name) is not None or any(name in s.source_nodes for s in model.plan):
            raise InvalidInput(f"node '{name}' can not be removed: only {', '.join(INPUT_TYPES)} nodes at the inputs "
                               f"and {', '.join(OUTPUT_TYPES)} nodes at the outputs can be removed, and not "
                               "ones compiled into a BPU subgraph")
        raise NotFound(f"node '{name}' is not in model '{model.name}'",
                       hint="list the removable nodes with: hb_model_modifier MODEL")
    if not found.side:
        raise InvalidInput(f"node '{name}' can not be removed: it is not adjacent to a model input or output "
                           "(other nodes follow it)",
                           hint="remove the nodes between it and the input/output first (Quantize top-down, "
                                "Dequantize bottom-up)")
    view = PlanView(model, blobs)
    if found.op_type == "Dequantize":
        removed = _remove_dequantize(model, view, found.index)
    elif found.op_type == "Quantize":
        removed = _remove_quantize(model, view, found.index)
    else:
        removed = _remove_cpu_op(model, view, found.index, found.op_type, found.side, blobs)
    model.build_info.deleted_nodes.append(removed.name)
    model.build_info.deleted_nodes_info.append(removed.info_line())
    return removed


def check_types(types: Sequence[str]) -> None:
    bad = [t for t in types if t not in TYPES]
    if bad:
        raise InvalidInput(f"unsupported node type(s) {bad}; hb_model_modifier removes: {', '.join(TYPES)}")


def modify(model: model_pb2.Model, blobs: Dict[str, bytes], names: Sequence[str] = (),
           types: Sequence[str] = ()) -> Tuple[model_pb2.Model, Dict[str, bytes], List[Removed]]:
    """A copy of ``model`` with every removable node of ``types`` and then ``names`` removed.

    Types are removed until none of them is removable any more (so ``-a Softmax
    -a Dequantize`` strips both, whatever the order); names one after another,
    in the order given. Returns the new model, its blobs (only those it uses)
    and what was removed.
    """
    check_types(types)
    new = model_pb2.Model()
    new.CopyFrom(model)
    blobs = dict(blobs)
    removed: List[Removed] = []
    while types:
        todo = next((c for c in removable_nodes(new, blobs) if c.op_type in types), None)
        if todo is None:
            break
        removed.append(remove_node(new, blobs, todo.name))
    done = {r.name for r in removed}
    for name in names:
        if name in done:
            continue
        removed.append(remove_node(new, blobs, name))
        done.add(name)
    used = {s.blob for s in new.plan if s.blob}
    return new, {k: v for k, v in blobs.items() if k in used}, removed


def modify_file(binfile: BinFile, names: Sequence[str] = (), types: Sequence[str] = ()):
    """``modify`` for the one model of a `.bin`; refuses packed files with the seed's message."""
    if binfile.manifest.packed or len(binfile.manifest.models) != 1:
        raise PackedModelNotSupported()
    return modify(binfile.manifest.models[0], binfile.blobs, names, types)


def modified_name(path: str) -> str:
    """``x.bin`` -> ``x_modified.bin`` (in the current directory, as the seed's examples show)."""
    import os

    stem = os.path.basename(path)
    stem = stem[:-4] if stem.endswith(".bin") else stem
    return f"{stem}_modified.bin"
