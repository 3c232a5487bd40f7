"""Load-time checks of a model's plan: a manifest that passed its checksum can still be inconsistent.

A `.bin` from a buggy producer or a hand-edited manifest re-sealed with a
correct checksum must fail at load with one InvalidModelFile naming the step,
not later with a KeyError or an onnxruntime error in the middle of a frame
(found by fuzzing, tests/fuzz/test_bin_reader.py). Checked here:

- input specs: a known input_type_rt, a numeric model_dtype, a model_shape of
  sane rank and size (a board allocates it for random perf inputs);
- data flow: every tensor a step reads was produced by an earlier step (or is
  a model input ``rt:<name>``), every model output is produced;
- each step against what it runs: an onnxruntime piece's inputs and outputs
  are the step's, with the element types and (where both sides know them)
  the shapes of what feeds them; a layout convert's perm is a permutation of
  its input's rank; a dequantize has its scale along an axis that exists.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from bpuemu.common.errors import InvalidModelFile
from bpuemu.common.input_types import FUSABLE_RT_TYPES, INPUT_TYPES_RT, model_hw, preprocess_output_type
from bpuemu.common.proto import model_pb2
from bpuemu.common.tensor import ORT_DTYPES, WIRE_DTYPES

Kind = model_pb2.PlanStep

#: Largest dimension and largest input a model may declare (per input, in bytes).
MAX_DIM = 1 << 20
MAX_INPUT_BYTES = 1 << 31

#: (shape with None for unknown dims, or None for unknown rank; numpy dtype name or None)
TensorType = Tuple[Optional[Tuple[Optional[int], ...]], Optional[str]]


def _bad(model: model_pb2.Model, what: str) -> InvalidModelFile:
    return InvalidModelFile(f"model '{model.name[:80]}': {what}",
                            hint="the .bin is damaged or was written by a faulty tool; re-create it with hb_mapper makertbin")


def check_input_spec(model: model_pb2.Model, spec: model_pb2.InputSpec) -> None:
    name = spec.name[:80]
    if spec.input_type_rt not in INPUT_TYPES_RT:
        raise _bad(model, f"input '{name}' has unknown input_type_rt '{spec.input_type_rt[:40]}'")
    dtype = WIRE_DTYPES.get(spec.model_dtype or "float32")  # a closed list: numpy parses any text as a record format
    if dtype is None or dtype.kind not in "iuf":
        raise _bad(model, f"input '{name}' has model_dtype '{spec.model_dtype[:40]}', not a numeric type")
    shape = list(spec.model_shape)
    if spec.input_type_rt != "featuremap" and len(shape) != 4:
        raise _bad(model, f"input '{name}' ({spec.input_type_rt}) needs a 4-D model_shape, has {shape[:8]}")
    if spec.input_type_rt != "featuremap" and spec.model_layout not in ("NCHW", "NHWC"):
        raise _bad(model, f"input '{name}' has model_layout '{spec.model_layout[:20]}', expected NCHW or NHWC")
    if not 1 <= len(shape) <= 8 or not all(1 <= d <= MAX_DIM for d in shape):
        raise _bad(model, f"input '{name}' has an unusable model_shape {shape[:8]}")
    if int(np.prod(shape, dtype=object)) * dtype.itemsize > MAX_INPUT_BYTES:
        raise _bad(model, f"input '{name}' model_shape {shape} is over {MAX_INPUT_BYTES} bytes")
    check_row_stride(model, spec)


def check_row_stride(model: model_pb2.Model, spec: model_pb2.InputSpec) -> None:
    """An nv12 row stride (a J6 march's) holds a row and at most one alignment unit (64 bytes) more."""
    if not spec.row_stride:
        return
    width = model_hw(spec)[2]
    if spec.input_type_rt != "nv12" or not width <= spec.row_stride < width + 64:
        raise _bad(model, f"input '{spec.name[:80]}' ({spec.input_type_rt}, {width} wide) has an unusable "
                          f"row_stride {spec.row_stride}")


def _ort_type(arg) -> TensorType:
    shape = tuple(d if isinstance(d, int) else None for d in arg.shape) if arg.shape is not None else None
    dtype = ORT_DTYPES.get(arg.type)
    return shape, dtype.name if dtype is not None else None


def _compatible(have: TensorType, want: TensorType) -> bool:
    (hs, hd), (ws, wd) = have, want
    if hd and wd and hd != wd:
        return False
    if hs is None or ws is None:
        return True
    return len(hs) == len(ws) and all(a is None or b is None or a == b for a, b in zip(hs, ws))


def _describe(t: TensorType) -> str:
    shape, dtype = t
    dims = "?" if shape is None else "x".join("?" if d is None else str(d) for d in shape) or "scalar"
    return f"{dtype or '?'} {dims}"


def _step_types(model, step, spec, session, types: Dict[str, TensorType]) -> List[TensorType]:
    """The types of ``spec``'s outputs; raises when its inputs cannot be what it runs on."""
    ins = [types[n] for n in spec.inputs]
    where = f"step '{spec.name[:80]}'"
    if spec.kind in (Kind.BPU_SUBGRAPH, Kind.CPU_OP, Kind.QUANTIZE):
        declared = {a.name: a for a in session.get_inputs()}
        if set(declared) != set(spec.inputs):
            raise _bad(model, f"{where} feeds {sorted(spec.inputs)[:8]} but its piece takes {sorted(declared)[:8]}")
        for n, t in zip(spec.inputs, ins):
            if not _compatible(t, _ort_type(declared[n])):
                raise _bad(model, f"{where} input '{n[:80]}' is {_describe(t)}, its piece takes {_describe(_ort_type(declared[n]))}")
        produced = {a.name: a for a in session.get_outputs()}
        missing = [n for n in spec.outputs if n not in produced]
        if missing or not spec.outputs:
            raise _bad(model, f"{where} names outputs {missing[:8] or '(none)'} its piece does not produce")
        return [_ort_type(produced[n]) for n in spec.outputs]
    if spec.kind == Kind.DEQUANTIZE:
        if len(spec.inputs) != 1 or len(spec.outputs) != 1:
            raise _bad(model, f"{where} must have one input and one output")
        if not len(spec.scale) or not np.all(np.isfinite(spec.scale)):
            raise _bad(model, f"{where} has no usable scale")
        if len(spec.zero_point) not in (0, 1, len(spec.scale)):
            raise _bad(model, f"{where} has {len(spec.zero_point)} zero points for {len(spec.scale)} scales")
        shape = ins[0][0]
        if len(spec.scale) > 1:
            if shape is None or not -len(shape) <= spec.axis < len(shape):
                raise _bad(model, f"{where} quantize axis {spec.axis} is not an axis of its {_describe(ins[0])} input")
            if shape[spec.axis] not in (None, len(spec.scale)):
                raise _bad(model, f"{where} has {len(spec.scale)} scales for axis {spec.axis} of size {shape[spec.axis]}")
        return [(shape, "float32")]
    if spec.kind == Kind.LAYOUT_CONVERT:
        if len(spec.inputs) != len(spec.outputs) or not spec.inputs:
            raise _bad(model, f"{where} must have as many outputs as inputs")
        perm = list(spec.perm)
        if not perm:
            return ins
        if sorted(perm) != list(range(len(perm))):
            raise _bad(model, f"{where} perm {perm[:8]} is not a permutation")
        out = []
        for t in ins:
            if t[0] is not None and len(t[0]) != len(perm):
                raise _bad(model, f"{where} perm {perm} does not fit its {_describe(t)} input")
            out.append((tuple(t[0][p] for p in perm) if t[0] is not None else None, t[1]))
        return out
    if spec.kind == Kind.PREPROCESS:
        if len(spec.inputs) != 1 or len(spec.outputs) != 1:
            raise _bad(model, f"{where} must have one input and one output")
        if spec.fused_into_subgraph and step.input_spec.input_type_rt not in FUSABLE_RT_TYPES:
            raise _bad(model, f"{where} cannot leave the {step.input_spec.input_type_rt} conversion to a subgraph")
        dtype, shape = preprocess_output_type(step.input_spec, spec.fused_into_subgraph)
        return [(shape, dtype.name)]
    raise _bad(model, f"{where} has unknown kind {spec.kind}")


def check_plan(model: model_pb2.Model, steps: Sequence) -> None:
    """Raise InvalidModelFile unless ``steps`` (built from ``model.plan``) can run in order."""
    for spec in model.input_specs:
        check_input_spec(model, spec)
    names = [p.name for p in model.inputs]
    if len(set(names)) != len(names):
        raise _bad(model, f"input names repeat: {names[:8]}")
    if not model.plan:
        raise _bad(model, "the plan has no steps")
    types: Dict[str, TensorType] = {f"rt:{n}": (None, None) for n in names}
    for step in steps:
        spec = step.spec
        unknown = [n for n in spec.inputs if n not in types]
        if unknown:
            raise _bad(model, f"step '{spec.name[:80]}' reads {unknown[:4]}, which no earlier step produces")
        for n, t in zip(spec.outputs, _step_types(model, step, spec, getattr(step, "session", None), types)):
            types[n] = t
    outputs = list(model.output_tensors) or [p.name for p in model.outputs]
    missing = [n for n in outputs if n not in types]
    if missing or not outputs:
        raise _bad(model, f"outputs {missing[:4] or '(none)'} are produced by no step")
    if len(model.outputs) != len(outputs):
        raise _bad(model, f"{len(model.outputs)} output properties for {len(outputs)} output tensors")
