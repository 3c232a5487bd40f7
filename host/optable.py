"""The X5 BPU operator support table: which ONNX ops the BPU runs, and as what.

One source of truth for the checker, the makertbin compile step and hb_perf.
Each entry: the BPU type name the tools print, and whether the op quantizes
actively (computes in int8 and requantizes its output) or passively (follows
its neighbours; it runs on the BPU only between BPU ops).
"""
from dataclasses import dataclass
from typing import Dict


@dataclass(frozen=True)
class BpuOp:
    bpu_type: str
    active: bool = True


BPU_OPS: Dict[str, BpuOp] = {
    "Conv": BpuOp("HzSQuantizedConv"),
    "ConvTranspose": BpuOp("HzSQuantizedConvTranspose"),
    "Gemm": BpuOp("HzSQuantizedConv"),
    "MatMul": BpuOp("HzSQuantizedMatmul"),
    "Add": BpuOp("HzSElementwiseAdd"),
    "Sub": BpuOp("HzSElementwiseSub"),
    "Mul": BpuOp("HzSElementwiseMul"),
    "Relu": BpuOp("HzSQuantizedConv", active=False),
    "Clip": BpuOp("HzSQuantizedConv", active=False),
    "LeakyRelu": BpuOp("HzLeakyRelu"),
    "Sigmoid": BpuOp("HzLut"),
    "Tanh": BpuOp("HzLut"),
    "HardSigmoid": BpuOp("HzLut"),
    "HardSwish": BpuOp("HzLut"),
    "Exp": BpuOp("HzLut"),
    "MaxPool": BpuOp("HzQuantizedMaxPool", active=False),
    "AveragePool": BpuOp("HzSQuantizedAvgPool"),
    "GlobalAveragePool": BpuOp("HzSQuantizedGlobalAvgPool"),
    "GlobalMaxPool": BpuOp("HzQuantizedGlobalMaxPool", active=False),
    "Resize": BpuOp("HzQuantizedResizeUpsample", active=False),
    "Concat": BpuOp("Concat", active=False),
    "Reshape": BpuOp("Reshape", active=False),
    "Flatten": BpuOp("Reshape", active=False),
    "Transpose": BpuOp("Transpose", active=False),
    "Split": BpuOp("Split", active=False),
    "Slice": BpuOp("Slice", active=False),
    "Pad": BpuOp("HzPad", active=False),
}
