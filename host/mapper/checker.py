"""hb_mapper checker: can this float model go to the BPU, and how would it split?

Validates what the seeds ask of an input model (opset and ir_version, fixed
4-D inputs, shape inference, known operators), then places every node of the
optimized model on the BPU or the CPU and reports the Node / ON / Subgraph /
Type table with a reason for each CPU node.
"""
import logging
from dataclasses import dataclass
from typing import Dict, List, Tuple

import onnx

from bpuemu.common.errors import InvalidInput
from bpuemu.host.compiler.placement import Placement, place
from bpuemu.host.convert.optimizer import optimize
from bpuemu.host.onnxgraph import default_opset, graph_inputs, load_onnx

log = logging.getLogger("bpuemu.host.checker")

#: What the X5 toolchain documents as supported (ptq_guide, "Model Preparation").
SEED_MAX_IR_VERSION = 7
SEED_OPSETS = (10, 11)
MIN_OPSET = 10


class CheckError(InvalidInput):
    pass


@dataclass
class CheckResult:
    model: onnx.ModelProto          # the optimized model that was placed
    placement: Placement
    warnings: List[str]


def parse_shape(text: str) -> Tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise CheckError(f"input shape '{text}' is not of the form 1x3x224x224") from None
    if not dims or any(d <= 0 for d in dims):
        raise CheckError(f"input shape '{text}' must have positive dimensions")
    return dims


def load_and_fix_inputs(path: str, input_shapes: Dict[str, Tuple[int, ...]]) -> Tuple[onnx.ModelProto, List[str]]:
    model = load_onnx(path)
    return fix_inputs(model, input_shapes)


def fix_inputs(model: onnx.ModelProto, input_shapes: Dict[str, Tuple[int, ...]]) -> Tuple[onnx.ModelProto, List[str]]:
    """Check opset, inputs and operators; --input-shape overrides an input's shape."""
    warnings = []
    opset = default_opset(model)
    if opset < MIN_OPSET:
        raise CheckError(f"opset {opset} is not supported (X5 supports opset 10 and 11)",
                         hint="re-export the model with opset 11")
    if opset not in SEED_OPSETS or model.ir_version > SEED_MAX_IR_VERSION:
        warnings.append(f"model has ir_version {model.ir_version}, opset {opset}; the X5 toolchain documents "
                        f"ir_version <= {SEED_MAX_IR_VERSION} and opset 10/11. bpuemu converts it anyway.")
    real = graph_inputs(model)
    unknown = set(input_shapes) - {i.name for i in real}
    if unknown:
        raise CheckError(f"--input-shape names {sorted(unknown)}, which are not model inputs ({', '.join(i.name for i in real)})")
    for vi in real:
        dims = vi.type.tensor_type.shape.dim
        if vi.name in input_shapes:
            shape = input_shapes[vi.name]
            if dims and len(dims) != len(shape):
                model_shape = "x".join(str(d.dim_value) if d.dim_value > 0 else "?" for d in dims)
                raise CheckError(f"--input-shape {vi.name} {'x'.join(map(str, shape))} has {len(shape)} dimensions, "
                                 f"the model's input '{vi.name}' has {len(dims)} ({model_shape})")
            vi.type.tensor_type.ClearField("shape")
            for d in shape:
                vi.type.tensor_type.shape.dim.add().dim_value = d
            continue
        values = [d.dim_value for d in dims]
        if any(v <= 0 for v in values):
            shown = "x".join(str(v) if v > 0 else "?" for v in values)
            raise CheckError(f"input '{vi.name}' has a dynamic shape {shown}",
                             hint=f"give the shape of {vi.name} (e.g. 1x3x224x224)", subject="input_shape")
        if len(values) != 4:
            warnings.append(f"input '{vi.name}' is {len(values)}-D; the X5 toolchain supports fixed 4-D inputs only")
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            raise CheckError(f"Not support layer name={n.name} type={n.op_type}",
                             hint=f"operator domain '{n.domain}' is not ONNX's, and bpuemu runs standard ONNX "
                                  "operators only (no custom operators): replace it with standard ONNX operators")
        try:
            onnx.defs.get_schema(n.op_type, opset, n.domain)
        except onnx.defs.SchemaError:
            raise CheckError(f"Not support layer name={n.name} type={n.op_type}") from None
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as exc:
        raise CheckError(f"shape inference failed: {str(exc).splitlines()[0]}") from None
    return model, warnings


def check(path: str, input_shapes: Dict[str, Tuple[int, ...]], prototxt: str = "") -> CheckResult:
    """Check an ONNX model, or with ``prototxt`` the Caffe model ``path`` (its caffemodel) converted to ONNX."""
    if prototxt:
        from bpuemu.host.caffe import caffe_to_onnx

        model, warnings = fix_inputs(caffe_to_onnx(prototxt, path, input_shapes), input_shapes)
    else:
        model, warnings = load_and_fix_inputs(path, input_shapes)
    optimized = optimize(model)
    four_d = [i.name for i in optimized.graph.input if len(i.type.tensor_type.shape.dim) == 4]
    placement = place(optimized, quantized_inputs=four_d)
    return CheckResult(optimized, placement, warnings)
