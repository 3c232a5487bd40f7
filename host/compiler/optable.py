"""The X5 BPU operator support table: which ONNX ops the BPU runs, and as what.

One source of truth for the checker, the makertbin compile step and hb_perf.
Each entry: the BPU type name the tools print, whether the op quantizes
actively (computes in int8 and requantizes its output) or passively (follows
its neighbours; it runs on the BPU only between BPU ops), and which BPU unit
executes it (what hb_perf's static latency model charges it to).
"""
from dataclasses import dataclass
from typing import Dict


#: BPU units (hb_perf): "mac" the int8 MAC array (convolution, matrix product);
#: "vector" the vector unit (elementwise, activation lookup tables, pooling,
#: reductions); "move" data movement (layout, gather, resampling); "view" a
#: change of shape only, which costs nothing.
UNITS = ("mac", "vector", "move", "view")


@dataclass(frozen=True)
class BpuOp:
    bpu_type: str
    active: bool = True
    #: runs on the CPU unless asked for (Softmax: set_Softmax_input_int8 / run_on_bpu)
    cpu_by_default: bool = False
    unit: str = "vector"
    #: may end the model with its int32 accumulator (higher precision), so a
    #: passive op after it at the model tail runs on the CPU (ptq_faq_x5 6.6.1.3)
    int32_output: bool = False


BPU_OPS: Dict[str, BpuOp] = {
    "Conv": BpuOp("HzSQuantizedConv", unit="mac", int32_output=True),
    "ConvTranspose": BpuOp("HzSQuantizedConvTranspose", unit="mac"),
    "Gemm": BpuOp("HzSQuantizedConv", unit="mac", int32_output=True),
    "MatMul": BpuOp("HzSQuantizedMatmul", unit="mac"),
    "Add": BpuOp("HzSElementwiseAdd"),
    "Sub": BpuOp("HzSElementwiseSub"),
    "Mul": BpuOp("HzSElementwiseMul"),
    "Relu": BpuOp("HzSQuantizedConv", active=False),
    "Clip": BpuOp("HzSQuantizedConv", active=False),
    "LeakyRelu": BpuOp("HzLeakyRelu"),
    "PRelu": BpuOp("HzPRelu"),
    "Sigmoid": BpuOp("HzLut"),
    "Tanh": BpuOp("HzLut"),
    "HardSigmoid": BpuOp("HzLut"),
    "HardSwish": BpuOp("HzLut"),
    "Exp": BpuOp("HzLut"),
    # x ** p with a constant exponent is a lookup table on the int8 input (ptq_guide's checker example)
    "Pow": BpuOp("HzLut"),
    "MaxPool": BpuOp("HzQuantizedMaxPool", active=False),
    "AveragePool": BpuOp("HzSQuantizedAvgPool"),
    "GlobalAveragePool": BpuOp("HzSQuantizedGlobalAvgPool"),
    "GlobalMaxPool": BpuOp("HzQuantizedGlobalMaxPool", active=False),
    "Resize": BpuOp("HzQuantizedResizeUpsample", active=False, unit="move"),
    "Concat": BpuOp("Concat", active=False, unit="move"),
    "Reshape": BpuOp("Reshape", active=False, unit="view"),
    "Flatten": BpuOp("Reshape", active=False, unit="view"),
    "Transpose": BpuOp("Transpose", active=False, unit="move"),
    "Split": BpuOp("Split", active=False, unit="move"),
    "Slice": BpuOp("Slice", active=False, unit="move"),
    "Pad": BpuOp("HzPad", active=False, unit="move"),
    "Softmax": BpuOp("HzSoftmax", cpu_by_default=True),
    "ReduceMean": BpuOp("HzSQuantizedReduceMean"),
    # over the channels of a 4-D featuremap, C <= 64 (ptq_guide "Argmax supports BPU acceleration only ...")
    "ArgMax": BpuOp("HzArgMax"),
    "Upsample": BpuOp("HzQuantizedResizeUpsample", active=False, unit="move"),
}


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            from onnx import helper

            return helper.get_attribute_value(a)
    return default


def check_constraints(node, model) -> str:
    """The first X5 BPU constraint ``node`` violates, or "" when it fits."""
    check = CONSTRAINTS.get(node.op_type)
    return check(node, model) if check else ""


def _conv(node, model) -> str:
    k = _attr(node, "kernel_shape") or []
    if any(d > 7 for d in k) and len(k) == 2:
        # X5: kernel H,W in [1,7] for general conv (larger only for depthwise up to 15 is not modelled)
        return f"kernel_shape {list(k)} exceeds 7x7"
    s = _attr(node, "strides") or []
    if any(d > 4 for d in s):
        return f"strides {list(s)} exceed 4"
    d = _attr(node, "dilations") or []
    if any(v > 16 for v in d):
        return f"dilations {list(d)} exceed 16"
    return ""


def _pool(node, model) -> str:
    k = _attr(node, "kernel_shape") or []
    if any(d > 256 for d in k):
        return f"kernel_shape {list(k)} exceeds 256"
    return ""


def _constant_of(model, name: str):
    """The value of ``name`` when an initializer or a Constant node makes it, else None."""
    from onnx import numpy_helper

    for t in model.graph.initializer:
        if t.name == name:
            return numpy_helper.to_array(t)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.output[0] == name:
            value = _attr(n, "value")
            return numpy_helper.to_array(value) if value is not None else None
    return None


def _shape_of(model, name: str):
    """The static shape of tensor ``name`` (graph input, value_info or output), or None."""
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
            return None if any(d is None or d <= 0 for d in dims) else dims
    return None


#: ArgMax: the largest channel count the BPU reduces over.
ARGMAX_MAX_CHANNELS = 64


def _pow(node, model) -> str:
    exponent = _constant_of(model, node.input[1]) if len(node.input) > 1 else None
    if exponent is None or exponent.size != 1:
        return "the exponent is not a constant scalar (a lookup table needs one)"
    return ""


def _argmax(node, model) -> str:
    shape = _shape_of(model, node.input[0])
    if shape is None:
        return "the input shape is unknown"
    if len(shape) != 4:
        return f"the input is {len(shape)}-D, not a 4-D featuremap"
    axis = int(_attr(node, "axis", 0))
    if axis not in (1, -3):
        return f"axis {axis} is not the channel axis (1)"
    if shape[1] > ARGMAX_MAX_CHANNELS:
        return f"{shape[1]} channels exceed {ARGMAX_MAX_CHANNELS}"
    if int(_attr(node, "select_last_index", 0)):
        return "select_last_index 1 is not supported"
    return ""


CONSTRAINTS = {
    "Conv": _conv,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "Pow": _pow,
    "ArgMax": _argmax,
}
