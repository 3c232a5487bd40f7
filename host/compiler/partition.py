"""Compile a QDQ quantized ONNX model into a `.bin` execution plan.

The quantized model (``*_quantized_model.onnx``) is cut at quantized tensors
(DESIGN.md, "Numerical contract"):

* a compute node runs on the BPU when the op table lists it and it lives
  entirely in the integer domain: every activation input comes from a
  DequantizeLinear and every output goes only to QuantizeLinear nodes;
  anything else runs on the CPU;
* consecutive BPU nodes form one BPU subgraph; each CPU node is its own
  piece. Every piece carries copies of the DequantizeLinear nodes that feed it
  and the QuantizeLinear nodes that follow it, so pieces exchange int8
  tensors exactly as the whole model does;
* a requantize (DequantizeLinear -> QuantizeLinear: a per-channel tensor
  brought to one scale for an op that takes one) joins the BPU subgraph that
  made the tensor;
* a QuantizeLinear on a float model input becomes ``<node>_HzQuantize``; a
  DequantizeLinear producing a model output becomes ``<node>_HzDequantize``
  (what hb_model_modifier can remove);
* layout-convert steps mark where tensors cross between the BPU and the CPU.

Each piece is stored as an ONNX model blob and run by the board runtime with
the same session options as any whole-model reference, which keeps the two
bit-exact.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import onnx
from onnx import helper

from bpuemu.common.errors import InvalidInput
from bpuemu.common.proto import model_pb2
from bpuemu.common.tensor import LAYOUT, TENSOR_TYPE_OF_DTYPE, TENSOR_TYPE_OF_INPUT_TYPE, make_properties
from bpuemu.common.input_types import model_hw, rt_byte_size, rt_shape
from bpuemu.common.march import march as march_of
from bpuemu.host.compiler.fuse_preprocess import fuse_preprocess
from bpuemu.host.compiler.optable import BPU_OPS
from bpuemu.host.onnxgraph import DQ, Q, GraphIndex, graph_inputs, name_nodes, value_infos

Kind = model_pb2.PlanStep
#: compiler_parameters.input_source values -> the tensor properties' inputSource.
INPUT_SOURCES = {"ddr": model_pb2.HB_DNN_INPUT_FROM_DDR, "pyramid": model_pb2.HB_DNN_INPUT_FROM_PYRAMID,
                 "resizer": model_pb2.HB_DNN_INPUT_FROM_RESIZER}


@dataclass
class Piece:
    kind: int
    name: str
    nodes: List[onnx.NodeProto] = field(default_factory=list)
    inputs: List[str] = field(default_factory=list)
    outputs: List[str] = field(default_factory=list)


@dataclass
class CompiledModel:
    """What the compile step hands the container writer."""

    model: model_pb2.Model
    blobs: Dict[str, bytes]
    pieces: List[Piece]

    def device_of(self) -> Dict[str, str]:
        """Source node name -> "BPU" / "CPU" (for the checker-style table)."""
        out = {}
        for step in self.model.plan:
            for n in step.source_nodes:
                out[n] = "BPU" if step.kind == Kind.BPU_SUBGRAPH else "CPU"
        return out


def featuremap_specs(model: onnx.ModelProto) -> List[model_pb2.InputSpec]:
    """InputSpecs for a model whose inputs are all featuremaps (float tensors)."""
    specs = []
    for vi in graph_inputs(model):
        t = vi.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        if any(d <= 0 for d in shape):
            raise InvalidInput(f"input '{vi.name}' has a dynamic shape {shape}; give it a fixed shape")
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        specs.append(
            model_pb2.InputSpec(
                name=vi.name,
                input_type_rt="featuremap",
                model_layout="NCHW" if len(shape) == 4 else "",
                model_dtype=np.dtype(dtype).name,
                model_shape=shape,
                plan_tensor=vi.name,
            )
        )
    return specs


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name)


class _Graph(GraphIndex):
    """The quantized graph's index (unnamed nodes named first), with the types of its tensors."""

    def __init__(self, model: onnx.ModelProto):
        name_nodes(model)
        super().__init__(model)
        self.value_info = value_infos(model)

    def is_float(self, tensor: str) -> bool:
        vi = self.value_info.get(tensor)
        return vi is None or vi.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                                                               onnx.TensorProto.DOUBLE)

    def is_dq_fed(self, tensor: str) -> bool:
        p = self.producer.get(tensor)
        return tensor in self.inits or (p is not None and p.op_type == DQ)


@dataclass(frozen=True)
class _J6:
    """What the J6 placement rules let the partition put on the BPU (empty on the X5)."""

    #: Nodes placed on the BPU that compute on integers as they are (an int32 Mul, ArgMax's Cast).
    integer_on_bpu: bool = False
    #: BPU nodes whose float output leaves the BPU unquantized (the tail Conv's int32 / float32).
    high_precision: frozenset = frozenset()


def _integer_exact(g: _Graph, node: onnx.NodeProto) -> bool:
    ins = [i for i in node.input if i and i not in g.inits]
    return bool(ins) and not any(g.is_float(t) for t in ins + [o for o in node.output if o])


def _device(g: _Graph, node: onnx.NodeProto, force_cpu: Set[str], force_bpu: Set[str], j6: _J6 = _J6()) -> str:
    op = BPU_OPS.get(node.op_type)
    if j6.integer_on_bpu and node.name in force_bpu and node.name not in force_cpu and _integer_exact(g, node):
        return "BPU"
    if node.name in force_cpu or op is None or (op.cpu_by_default and node.name not in force_bpu):
        return "CPU"
    if not all(g.is_dq_fed(i) for i in node.input if i):
        return "CPU"
    for o in node.output:
        if not g.is_float(o) or node.name in j6.high_precision:
            continue  # an exact integer result (ArgMax's indices), or the tail Conv's, leaves the BPU as it is
        if o in g.outputs:
            return "CPU"
        if any(c.op_type != Q for c in g.readers(o)):
            return "CPU"
    return "BPU"


def _partition(g: _Graph, model_name: str, force_cpu: Set[str], force_bpu: Set[str],
               j6: _J6 = _J6()) -> Tuple[List[Piece], Dict[str, onnx.NodeProto]]:
    """Group the graph's nodes into pieces in execution order.

    Returns the pieces (BPU subgraphs, CPU ops, input quantizes) and the
    output DequantizeLinear nodes by output name.
    """
    pieces: List[Piece] = []
    piece_of: Dict[str, Piece] = {}
    current: Optional[Piece] = None
    output_dq: Dict[str, onnx.NodeProto] = {}
    n_sub = 0
    for node in g.nodes:
        if node.op_type == DQ:
            if node.output[0] in g.outputs and node.input[0] not in g.inits:
                output_dq[node.output[0]] = node
            continue  # copied into consuming pieces below
        if node.op_type == Q:
            src = node.input[0]
            if src in g.inputs:
                pieces.append(Piece(Kind.QUANTIZE, f"{node.name}_HzQuantize", [node]))
                piece_of[node.name] = pieces[-1]
                continue
            prod = g.producer.get(src)
            if prod is not None and prod.name in piece_of:
                piece_of[prod.name].nodes.append(node)
                piece_of[node.name] = piece_of[prod.name]
                continue
            maker = _requantized_subgraph(g, prod, piece_of)
            if maker is not None:
                maker.nodes.append(node)
                piece_of[node.name] = maker
                continue
        device = "CPU" if node.op_type == Q else _device(g, node, force_cpu, force_bpu, j6)
        if device == "BPU":
            if current is None:
                current = Piece(Kind.BPU_SUBGRAPH, f"BPU_{model_name}_subgraph_{n_sub}")
                n_sub += 1
                pieces.append(current)
            current.nodes.append(node)
            piece_of[node.name] = current
        else:
            current = None
            pieces.append(Piece(Kind.CPU_OP, node.name, [node]))
            piece_of[node.name] = pieces[-1]
    return pieces, output_dq


def _requantized_subgraph(g: _Graph, dq: Optional[onnx.NodeProto], piece_of: Dict[str, Piece]) -> Optional[Piece]:
    """The BPU subgraph whose QuantizeLinear output ``dq`` dequantizes, when ``dq`` is a DequantizeLinear
    (a QuantizeLinear reading it requantizes that subgraph's tensor)."""
    if dq is None or dq.op_type != DQ:
        return None
    q = g.producer.get(dq.input[0])
    piece = piece_of.get(q.name) if q is not None and q.op_type == Q else None
    return piece if piece is not None and piece.kind == Kind.BPU_SUBGRAPH else None


def _with_feeding_dq(g: _Graph, piece: Piece) -> List[onnx.NodeProto]:
    """The piece's nodes plus copies of the DequantizeLinear nodes feeding them, in graph order."""
    names = {n.name for n in piece.nodes}
    extra = {}
    for n in piece.nodes:
        for i in n.input:
            p = g.producer.get(i)
            if p is not None and p.op_type == DQ and p.name not in names:
                extra[p.name] = p
    return sorted(list(piece.nodes) + list(extra.values()), key=lambda n: g.position[n.name])


def _piece_io(g: _Graph, nodes: List[onnx.NodeProto]) -> Tuple[List[str], List[str]]:
    produced, inputs = set(), []
    for n in nodes:
        for i in n.input:
            if i and i not in produced and i not in g.inits and i not in inputs:
                inputs.append(i)
        produced.update(o for o in n.output if o)
    return inputs, [o for n in nodes for o in n.output if o]


def _piece_model(g: _Graph, piece: Piece, nodes: List[onnx.NodeProto]) -> bytes:
    used = {i for n in nodes for i in n.input}
    inits = [g.inits[name] for name in sorted(used & g.inits.keys())]

    def vi(name):
        if name in g.value_info:
            return g.value_info[name]
        raise InvalidInput(f"cannot compile '{piece.name}': type of tensor '{name}' is unknown (shape inference failed)")

    graph = helper.make_graph(
        nodes, _safe(piece.name), [vi(i) for i in piece.inputs], [vi(o) for o in piece.outputs], initializer=inits
    )
    m = helper.make_model(graph, opset_imports=list(g.model.opset_import), producer_name="bpuemu")
    m.ir_version = g.model.ir_version
    return m.SerializeToString()


def _dequantize_step(g: _Graph, node: onnx.NodeProto) -> model_pb2.PlanStep:
    scale = g.const(node.input[1]).reshape(-1)
    zp = g.const(node.input[2]).reshape(-1) if len(node.input) > 2 and node.input[2] else np.zeros(1, np.int32)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    return model_pb2.PlanStep(
        kind=Kind.DEQUANTIZE,
        name=f"{node.name}_HzDequantize",
        inputs=[node.input[0]],
        outputs=[node.output[0]],
        scale=scale.astype(np.float32).tolist(),
        zero_point=zp.astype(np.int64).tolist(),
        axis=axis,
        source_nodes=[node.name],
    )


def _np_dtype(g: _Graph, name: str) -> np.dtype:
    t = g.value_info[name].type.tensor_type
    return np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))


def _shape(g: _Graph, name: str) -> List[int]:
    return [d.dim_value for d in g.value_info[name].type.tensor_type.shape.dim]


def compile_model(
    quantized: onnx.ModelProto,
    model_name: str,
    input_specs: Optional[Sequence[model_pb2.InputSpec]] = None,
    *,
    force_cpu: Sequence[str] = (),
    force_bpu: Sequence[str] = (),
    build_info: Optional[model_pb2.BuildInfo] = None,
    march: str = "bayes-e",
    input_sources: Optional[Dict[str, str]] = None,
    fuse_preprocess_steps: bool = True,
    high_precision: Sequence[str] = (),
) -> CompiledModel:
    """Partition ``quantized`` and build the `.bin` Model entry and its blobs.

    ``input_sources``: input name -> ddr | pyramid | resizer (compiler_parameters.input_source,
    defaults filled in); an input it does not name gets pyramid for nv12, else ddr.
    ``fuse_preprocess_steps``: compile image inputs' Preprocess into the subgraph that reads them
    (``fuse_preprocess``); False keeps the separate converting step (format 1.0 plans).
    ``high_precision``: BPU nodes whose output leaves the model unquantized (the J6 tail Conv).
    On a J6 march, integer nodes placed on the BPU (in ``force_bpu``) run there.
    """
    from bpuemu.common.march import MARCHES

    g = _Graph(quantized)
    specs = _checked_specs(g, input_specs)
    j6 = _J6(integer_on_bpu=march in MARCHES and MARCHES[march].is_j6, high_precision=frozenset(high_precision))
    pieces, output_dq = _partition(g, model_name, set(force_cpu), set(force_bpu), j6)
    piece_nodes, made_by = _connect(g, pieces, output_dq)
    blobs: Dict[str, bytes] = {}
    plan = _preprocess_steps(specs)
    plan += _piece_steps(g, pieces, piece_nodes, made_by, output_dq, blobs)
    plan += _remaining_dequantize_steps(g, plan, output_dq)
    if fuse_preprocess_steps:
        fuse_preprocess(plan, blobs, specs, list(g.outputs))
    model = _model_entry(g, model_name, march, specs, input_sources)
    model.plan.extend(plan)
    if build_info is not None:
        model.build_info.CopyFrom(build_info)
    return CompiledModel(model, blobs, pieces)


def _checked_specs(g: _Graph, input_specs: Optional[Sequence[model_pb2.InputSpec]]) -> List[model_pb2.InputSpec]:
    """The input specs (featuremaps when none are given); they must name exactly the model's inputs."""
    specs = list(input_specs) if input_specs is not None else featuremap_specs(g.model)
    spec_names = [s.plan_tensor for s in specs]
    if sorted(spec_names) != sorted(g.inputs):
        raise InvalidInput(f"input specs {spec_names} do not match the model inputs {g.inputs}")
    return specs


def _preprocess_steps(specs: Sequence[model_pb2.InputSpec]) -> List[model_pb2.PlanStep]:
    """One Preprocess step per input: the runtime's input conversion into the plan tensor."""
    return [model_pb2.PlanStep(kind=Kind.PREPROCESS, name="Preprocess", inputs=[f"rt:{spec.name}"],
                               outputs=[spec.plan_tensor], input_index=i) for i, spec in enumerate(specs)]


def _connect(g: _Graph, pieces: List[Piece], output_dq: Dict[str, onnx.NodeProto]):
    """Each piece's nodes (with its feeding DequantizeLinear copies), inputs and exported outputs.

    A piece exports what another piece, an output DequantizeLinear or the model
    output reads. Returns the pieces' nodes and which piece makes each exported tensor.
    """
    piece_nodes = [_with_feeding_dq(g, p) for p in pieces]
    for p, nodes in zip(pieces, piece_nodes):
        p.inputs, _ = _piece_io(g, nodes)
    read_elsewhere: Set[str] = set(g.outputs) | {n.input[0] for n in output_dq.values()}
    for p in pieces:
        read_elsewhere.update(p.inputs)
    made_by: Dict[str, Piece] = {}
    for p, nodes in zip(pieces, piece_nodes):
        own = {o for n in p.nodes for o in n.output if o}
        p.outputs = [o for n in nodes for o in n.output if o in own and o in read_elsewhere and o not in output_dq]
        for o in p.outputs:
            made_by[o] = p
    return piece_nodes, made_by


def _piece_steps(g: _Graph, pieces: List[Piece], piece_nodes: List[List[onnx.NodeProto]], made_by: Dict[str, Piece],
                 output_dq: Dict[str, onnx.NodeProto], blobs: Dict[str, bytes]) -> List[model_pb2.PlanStep]:
    """Per piece in order: its blob (added to ``blobs``), its step, the layout converts around a
    BPU subgraph, and the output dequantizes of what it makes."""
    plan: List[model_pb2.PlanStep] = []
    for idx, (p, nodes) in enumerate(zip(pieces, piece_nodes)):
        blob = f"{idx:03d}_{_safe(p.name)}"
        blobs[blob] = _piece_model(g, p, nodes)
        is_bpu = p.kind == Kind.BPU_SUBGRAPH
        base = p.name[len("BPU_"):] if is_bpu else p.name
        if is_bpu:
            from_cpu = [i for i in p.inputs if i in made_by]
            if from_cpu:
                plan.append(model_pb2.PlanStep(kind=Kind.LAYOUT_CONVERT, name=f"{base}_input_layout_convert", inputs=from_cpu, outputs=from_cpu))
        plan.append(
            model_pb2.PlanStep(
                kind=p.kind,
                name=p.name,
                inputs=p.inputs,
                outputs=p.outputs,
                blob=blob,
                op_types=[n.op_type for n in p.nodes],
                source_nodes=[n.name for n in p.nodes],
            )
        )
        if is_bpu:
            to_cpu = [
                o for o in p.outputs
                if o in g.outputs
                or any(n.input[0] == o for n in output_dq.values())
                or any(o in q.inputs and q.kind != Kind.BPU_SUBGRAPH for q in pieces)
            ]
            if to_cpu:
                plan.append(model_pb2.PlanStep(kind=Kind.LAYOUT_CONVERT, name=f"{base}_output_layout_convert", inputs=to_cpu, outputs=to_cpu))
        for dq in output_dq.values():
            if dq.input[0] in p.outputs:
                plan.append(_dequantize_step(g, dq))
    return plan


def _remaining_dequantize_steps(g: _Graph, plan: Sequence[model_pb2.PlanStep],
                                output_dq: Dict[str, onnx.NodeProto]) -> List[model_pb2.PlanStep]:
    """Output DQs fed straight from a model input or a CPU-quantized input."""
    planned = {s.name for s in plan}
    return [_dequantize_step(g, dq) for dq in output_dq.values() if f"{dq.name}_HzDequantize" not in planned]


def _model_entry(g: _Graph, model_name: str, march: str, specs: Sequence[model_pb2.InputSpec],
                 input_sources: Optional[Dict[str, str]]) -> model_pb2.Model:
    """The Model entry without its plan: input specs and the tensor properties of inputs and outputs."""
    model = model_pb2.Model(name=model_name, march=march, output_tensors=g.outputs)
    model.input_specs.extend(specs)
    align_nv12_rows(model)
    model.inputs.extend(_input_properties(spec, input_sources) for spec in model.input_specs)
    for out in g.outputs:
        dtype = _np_dtype(g, out)
        shape = _shape(g, out)
        layout = LAYOUT.HB_DNN_LAYOUT_NCHW if len(shape) == 4 else LAYOUT.HB_DNN_LAYOUT_NONE
        model.outputs.append(make_properties(out, shape, TENSOR_TYPE_OF_DTYPE[dtype], layout))
    return model


def align_nv12_rows(model: model_pb2.Model) -> None:
    """Each nv12 input's row stride, the width rounded up to the march's nv12_stride_align (J6: 32 or 64;
    the X5 keeps dense rows, row_stride 0)."""
    m = march_of(model.march or None)
    if m.nv12_stride_align <= 1:
        return
    for spec in model.input_specs:
        if spec.input_type_rt == "nv12":
            spec.row_stride = m.aligned_stride(model_hw(spec)[2])


def _nv12_alignment(props: model_pb2.TensorProperties, spec: model_pb2.InputSpec) -> None:
    """An nv12 input with aligned rows: alignedShape (N, 3, H, row stride), stride (frame bytes, 0, row
    stride, 1): what a user pads each row of the Y and UV planes to."""
    if not spec.row_stride:
        return
    n, c, h, _ = props.valid_shape
    props.aligned_shape[:] = [n, c, h, spec.row_stride]
    props.stride[:] = [h * spec.row_stride * 3 // 2, 0, spec.row_stride, 1]


def _input_properties(spec: model_pb2.InputSpec, input_sources: Optional[Dict[str, str]]) -> model_pb2.TensorProperties:
    """What the application hands in for ``spec``: its tensor type, layout, byte size and input source."""
    tt = TENSOR_TYPE_OF_INPUT_TYPE[spec.input_type_rt]
    if spec.input_type_rt == "featuremap":
        tt = TENSOR_TYPE_OF_DTYPE[np.dtype(spec.model_dtype or "float32")]
        layout = LAYOUT.HB_DNN_LAYOUT_NCHW if spec.model_layout == "NCHW" else (
            LAYOUT.HB_DNN_LAYOUT_NHWC if spec.model_layout == "NHWC" else LAYOUT.HB_DNN_LAYOUT_NONE)
    elif spec.input_type_rt == "nv12":
        layout = LAYOUT.HB_DNN_LAYOUT_NCHW
    else:
        layout = LAYOUT.HB_DNN_LAYOUT_NHWC if spec.input_layout_rt == "NHWC" else LAYOUT.HB_DNN_LAYOUT_NCHW
    source = (input_sources or {}).get(spec.name) or ("pyramid" if spec.input_type_rt == "nv12" else "ddr")
    props = make_properties(spec.name, rt_shape(spec), tt, layout, byte_size=rt_byte_size(spec),
                            input_source=INPUT_SOURCES[source])
    _nv12_alignment(props, spec)
    return props
