"""Small float models and data for tests/host/test_quant.py, built with onnx.helper.

``zoo_model`` covers the op kinds the quantizer must handle in one graph: conv
+ relu, depthwise conv, a residual add, max/average/global pooling, sigmoid,
concat, resize, flatten + gemm, and two outputs (a Gemm and a tail Conv).
"""
import os
import tempfile
from typing import Dict, List, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Builder:
    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: List[onnx.NodeProto] = []
        self.inits: List[onnx.TensorProto] = []

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: Sequence[str], name: str, out: str = "", **attrs) -> str:
        out = out or f"{name}_out"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=name, **attrs))
        return out

    def conv(self, name: str, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, group: int = 1,
             relu: bool = True, out: str = "") -> str:
        fan_in = cin // group * k * k
        w = (self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        b = (self.rng.standard_normal(cout) * 0.1).astype(np.float32)
        y = self.node("Conv", [x, self.init(f"{name}_w", w), self.init(f"{name}_b", b)], name,
                      out=out if not relu else "", kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)
        return self.node("Relu", [y], f"{name}_relu", out=out) if relu else y

    def model(self, name: str, inputs: Dict[str, Sequence[int]], outputs: Dict[str, Sequence[int]], opset: int = 13) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs.items()],
            initializer=self.inits,
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="bpuemu-tests")
        m.ir_version = 8 if opset < 21 else 10
        onnx.checker.check_model(m)
        return m


def zoo_model(size: int = 16, seed: int = 0) -> onnx.ModelProto:
    b = Builder(seed)
    r1 = b.conv("Conv_stem", "x", 3, 8)
    r2 = b.conv("Conv_dw", r1, 8, 8, group=8)
    pw = b.conv("Conv_pw", r2, 8, 8, k=1, relu=False)
    add = b.node("Add", [pw, r1], "Add_res")
    r3 = b.node("Relu", [add], "Relu_res")
    mp = b.node("MaxPool", [r3], "MaxPool_0", kernel_shape=[2, 2], strides=[2, 2])
    ap = b.node("AveragePool", [mp], "AveragePool_0", kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=0)
    sg = b.node("Sigmoid", [b.conv("Conv_gate", ap, 8, 8, k=1, relu=False)], "Sigmoid_gate")
    cat = b.node("Concat", [ap, sg], "Concat_0", axis=1)
    rs = b.node("Resize", [cat, "", b.init("resize_scales", np.array([1, 1, 2, 2], np.float32))], "Resize_up", mode="nearest")
    r4 = b.conv("Conv_down", rs, 16, 8, stride=2)
    gap = b.node("GlobalAveragePool", [r4], "GlobalAveragePool_0")
    flat = b.node("Flatten", [gap], "Flatten_0", axis=1)
    w = (b.rng.standard_normal((10, 8)) * 0.5).astype(np.float32)
    b.node("Gemm", [flat, b.init("fc_w", w), b.init("fc_b", np.full(10, 0.1, np.float32))], "Gemm_fc", out="logits", transB=1)
    gmp = b.node("GlobalMaxPool", [r4], "GlobalMaxPool_0")
    b.conv("Conv_head", gmp, 8, 4, k=1, relu=False, out="head")
    return b.model("zoo", {"x": [1, 3, size, size]}, {"logits": [1, 10], "head": [1, 4, 1, 1]})


def squeeze_excitation_model(size: int = 8, seed: int = 3) -> onnx.ModelProto:
    """Conv -> HardSwish, read by a GlobalAveragePool head (-> Conv -> HardSigmoid) and by the Mul that
    scales it (a squeeze-excitation block, as in PP-OCR's classifier), then a tail Conv."""
    b = Builder(seed)
    h = b.node("HardSwish", [b.conv("Conv_a", "x", 3, 8, relu=False)], "HardSwish_a")
    gap = b.node("GlobalAveragePool", [h], "GlobalAveragePool_se")
    s = b.node("HardSigmoid", [b.conv("Conv_se", gap, 8, 8, k=1, relu=False)], "HardSigmoid_se")
    m = b.node("Mul", [h, s], "Mul_se")
    b.conv("Conv_out", m, 8, 4, k=1, relu=False, out="y")
    return b.model("se", {"x": [1, 3, size, size]}, {"y": [1, 4, size, size]}, opset=14)


def deconv_matmul_model(size: int = 8, seed: int = 4) -> onnx.ModelProto:
    """Conv -> grouped ConvTranspose (weight axis 1) -> MatMul by a constant -> Gemm (transB=0)."""
    b = Builder(seed)
    r = b.conv("Conv_in", "x", 3, 8)
    w = (b.rng.standard_normal((8, 2, 2, 2)) * 0.5).astype(np.float32)  # [Cin, Cout/group, kH, kW], group 2
    bias = (b.rng.standard_normal(4) * 0.1).astype(np.float32)
    up = b.node("ConvTranspose", [r, b.init("deconv_w", w), b.init("deconv_b", bias)], "ConvTranspose_up",
                kernel_shape=[2, 2], strides=[2, 2], group=2)
    mm = b.node("MatMul", [up, b.init("mm_w", (b.rng.standard_normal((2 * size, 6)) * 0.3).astype(np.float32))], "MatMul_w")
    flat = b.node("Flatten", [b.node("GlobalAveragePool", [mm], "GlobalAveragePool_0")], "Flatten_0", axis=1)
    gw = (b.rng.standard_normal((4, 5)) * 0.5).astype(np.float32)  # [K, N]: transB = 0
    b.node("Gemm", [flat, b.init("fc_w", gw), b.init("fc_b", np.zeros(5, np.float32))], "Gemm_fc", out="y")
    return b.model("deconv_matmul", {"x": [1, 3, size, size]}, {"y": [1, 5]})


def two_input_model(size: int = 16, seed: int = 1) -> onnx.ModelProto:
    """Two featuremap inputs, a conv each, added, then a tail conv."""
    b = Builder(seed)
    a = b.conv("Conv_a", "a", 3, 8)
    c = b.conv("Conv_b", "b", 2, 8)
    s = b.node("Add", [a, c], "Add_ab")
    b.conv("Conv_y", s, 8, 4, k=1, relu=False, out="y")
    return b.model("two_input", {"a": [1, 3, size, size], "b": [1, 2, size, size]}, {"y": [1, 4, size, size]})


def relu_model(size: int = 8, seed: int = 2) -> onnx.ModelProto:
    """Conv -> Relu -> Conv: the Relu output is all >= 0 (for asymmetric quantization)."""
    b = Builder(seed)
    r = b.conv("Conv_a", "x", 3, 8)
    b.conv("Conv_b", r, 8, 4, k=1, relu=False, out="y")
    return b.model("relu", {"x": [1, 3, size, size]}, {"y": [1, 4, size, size]})


def negative_conv_relu_model(size: int = 8, seed: int = 5) -> onnx.ModelProto:
    """Conv (bias -6: mostly large negative outputs) -> Relu -> Conv: the first Conv's output
    takes the Relu's small non-negative range, so most of its values clip."""
    b = Builder(seed)
    w = (b.rng.standard_normal((8, 3, 3, 3)) * 0.5).astype(np.float32)
    y = b.node("Conv", ["x", b.init("Conv_a_w", w), b.init("Conv_a_b", np.full(8, -6.0, np.float32))], "Conv_a",
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    r = b.node("Relu", [y], "Conv_a_relu")
    b.conv("Conv_b", r, 8, 4, k=1, relu=False, out="y")
    return b.model("negative_relu", {"x": [1, 3, size, size]}, {"y": [1, 4, size, size]})


def identity_conv_model(channels: int = 4, size: int = 16) -> onnx.ModelProto:
    """A 1x1 identity conv: its input activation statistics are exactly the data fed."""
    b = Builder(0)
    w = np.eye(channels, dtype=np.float32).reshape(channels, channels, 1, 1)
    b.node("Conv", ["x", b.init("w", w), b.init("bias", np.zeros(channels, np.float32))], "Conv_id", out="y", kernel_shape=[1, 1])
    return b.model("identity", {"x": [1, channels, size, size]}, {"y": [1, channels, size, size]})


def opset11_model(size: int = 8) -> onnx.ModelProto:
    b = Builder(3)
    r = b.conv("Conv_a", "x", 3, 4)
    b.conv("Conv_b", r, 4, 4, k=1, relu=False, out="y")
    return b.model("old_opset", {"x": [1, 3, size, size]}, {"y": [1, 4, size, size]}, opset=11)


def featuremaps(model: onnx.ModelProto, count: int, seed: int) -> List[Dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in model.graph.input}
    return [{n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()} for _ in range(count)]


def images(model: onnx.ModelProto, count: int, seed: int, name: str = "data") -> List[Dict[str, np.ndarray]]:
    """X_128 image data: integers in [-128, 127] held in float32, with some structure (smooth gradients)."""
    rng = np.random.default_rng(seed)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    n, c, h, w = shape
    yy, xx = np.meshgrid(np.linspace(-1, 1, h), np.linspace(-1, 1, w), indexing="ij")
    out = []
    for _ in range(count):
        base = np.stack([np.sin(rng.uniform(1, 4) * xx + rng.uniform(0, 3) * yy + rng.uniform(0, 6)) for _ in range(c)])
        img = 100 * base[None] + rng.normal(0, 12, (n, c, h, w))
        out.append({name: np.clip(np.rint(img), -128, 127).astype(np.float32)})
    return out


def ort_quantize_static(model: onnx.ModelProto, samples: List[Dict[str, np.ndarray]], symmetric: bool) -> onnx.ModelProto:
    """A QDQ model made by onnxruntime's quantize_static (what calibration_type load reads)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    class Reader:
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory(prefix="bpuemu-tests-") as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "qdq.onnx")
        onnx.save(model, src)
        quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True})
        return onnx.load(dst)


#: The height and width of pow_argmax_model's input.
POW_ARGMAX_SIZE = 8


def pow_argmax_model(channels: int = 8, exponent_input: bool = False) -> onnx.ModelProto:
    """data -> conv1 -> Pow(2) -> conv2 (``channels`` outputs) -> ArgMax over the channels -> idx."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((channels, 8, 1, 1)) * 0.3).astype(np.float32), "w2")]
    inputs = [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, POW_ARGMAX_SIZE, POW_ARGMAX_SIZE])]
    if exponent_input:
        inputs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, []))
    else:
        inits.append(numpy_helper.from_array(np.array(2.0, np.float32), "p"))
    nodes = [helper.make_node("Conv", ["data", "w1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Pow", ["c1", "p"], ["pw"], name="pow"),
             helper.make_node("Conv", ["pw", "w2"], ["c2"], name="conv2", kernel_shape=[1, 1]),
             helper.make_node("ArgMax", ["c2"], ["idx"], name="argmax", axis=1, keepdims=1)]
    graph = helper.make_graph(nodes, "pow_argmax", inputs,
                              [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 1, POW_ARGMAX_SIZE, POW_ARGMAX_SIZE])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
