"""Tiny ONNX models for the tests, built with onnx.helper, and their references.

Every float model here is quantized the way the toolchain's stand-in does it
(onnxruntime ``quantize_static``, QDQ, QInt8), compiled with ``compile_model``
and written with ``write_bin``; the reference a test compares the runtime with
is the *whole* quantized model run by onnxruntime with the runtime's own
session options (DESIGN.md, "Numerical contract").
"""
import os
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from bpuemu.board.runtime.sessions import session_options
from bpuemu.common.container import write_bin
from bpuemu.common.proto import model_pb2

OPSET = 13


# --- float models ------------------------------------------------------------

class _Builder:
    """Collects nodes and initializers of a small float CNN."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: List[onnx.NodeProto] = []
        self.inits: List[onnx.TensorProto] = []

    def conv(self, name: str, x: str, cin: int, cout: int, k: int = 3, relu: bool = True) -> str:
        w = self.rng.standard_normal((cout, cin, k, k)).astype(np.float32) * np.float32(np.sqrt(2.0 / (cin * k * k)))
        b = self.rng.standard_normal(cout).astype(np.float32) * np.float32(0.1)
        self.inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
        out = f"{name}_out"
        self.nodes.append(
            helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [out], name=name, kernel_shape=[k, k], pads=[k // 2] * 4)
        )
        if not relu:
            return out
        self.nodes.append(helper.make_node("Relu", [out], [f"{name}_relu"], name=f"{name}_relu"))
        return f"{name}_relu"

    def node(self, op: str, inputs: Sequence[str], name: str, **attrs) -> str:
        out = f"{name}_out"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=name, **attrs))
        return out

    def model(self, graph_name: str, inputs: Dict[str, Sequence[int]], outputs: Dict[str, Sequence[int]]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            graph_name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs.items()],
            initializer=self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="bpuemu-tests")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def _rename_output(b: _Builder, tensor: str, name: str) -> None:
    for n in b.nodes:
        for i, o in enumerate(n.output):
            if o == tensor:
                n.output[i] = name


def cpu_middle_model(size: int = 16, c: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Conv -> Relu -> Softmax (not a BPU op) -> Conv -> Relu: two BPU subgraphs with a CPU op between."""
    b = _Builder(seed)
    x = b.conv("Conv_a", "x", 3, c)
    x = b.node("Softmax", [x], "Softmax_mid", axis=1)
    x = b.conv("Conv_b", x, c, c)
    _rename_output(b, x, "y")
    return b.model("cpu_middle", {"x": [1, 3, size, size]}, {"y": [1, c, size, size]})


def residual_model(size: int = 16, c: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Add(skip) -> Relu -> Conv (no relu) at the output."""
    b = _Builder(seed)
    a = b.conv("Conv_in", "x", 3, c)
    r = b.conv("Conv_res", a, c, c, relu=False)
    s = b.node("Add", [a, r], "Add_skip")
    s = b.node("Relu", [s], "Relu_skip")
    y = b.conv("Conv_out", s, c, c, k=1, relu=False)
    _rename_output(b, y, "y")
    return b.model("residual", {"x": [1, 3, size, size]}, {"y": [1, c, size, size]})


def two_input_model(size: int = 16, c: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Two featuremap inputs, one conv each, summed and convolved again."""
    b = _Builder(seed)
    a = b.conv("Conv_a", "a", 3, c)
    bb = b.conv("Conv_b", "b", 2, c)
    s = b.node("Add", [a, bb], "Add_ab")
    y = b.conv("Conv_y", s, c, 4, k=1, relu=False)
    _rename_output(b, y, "y")
    return b.model("two_input", {"a": [1, 3, size, size], "b": [1, 2, size, size]}, {"y": [1, 4, size, size]})


def gray_model(size: int = 16, c: int = 4, seed: int = 0) -> onnx.ModelProto:
    """A one-channel image CNN: its input is GRAY_128 (values -128..127, NCHW)."""
    b = _Builder(seed)
    x = b.conv("Conv_g", "data", 1, c)
    y = b.conv("Conv_h", x, c, c, k=1, relu=False)
    _rename_output(b, y, "y")
    return b.model("gray", {"data": [1, 1, size, size]}, {"y": [1, c, size, size]})


# --- quantization ------------------------------------------------------------

class _Reader:
    def __init__(self, samples):
        self._it = iter(samples)

    def get_next(self):
        return next(self._it, None)


def calibration_data(model: onnx.ModelProto, count: int = 4, seed: int = 1) -> List[Dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in model.graph.input}
    return [{n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()} for _ in range(count)]


def quantize_qdq(
    float_model: onnx.ModelProto,
    samples: Optional[List[Dict[str, np.ndarray]]] = None,
    *,
    per_channel: bool,
    op_types: Optional[Sequence[str]] = None,
    extra_options: Optional[dict] = None,
) -> onnx.ModelProto:
    """QDQ / QInt8 quantization by onnxruntime's quantize_static, in a private temp dir."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    samples = samples if samples is not None else calibration_data(float_model)
    extra = {"ActivationSymmetric": False, "WeightSymmetric": True}
    extra.update(extra_options or {})
    with tempfile.TemporaryDirectory(prefix="bpuemu-tests-") as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "quant.onnx")
        onnx.save(float_model, src)
        quantize_static(
            src,
            dst,
            _Reader(samples),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=list(op_types) if op_types else None,
            extra_options=extra,
        )
        return onnx.load(dst)


def quantized_sample(per_channel: bool, size: int = 16, image_input: bool = True, seed: int = 0) -> onnx.ModelProto:
    """host/samples.py's CNN, quantized like ``quantize_sample`` but with a choice of per_channel."""
    from bpuemu.host import samples

    fmodel = samples.sample_float_model(size, size, image_input=image_input, seed=seed)
    extra = {}
    if image_input:
        extra["TensorQuantOverrides"] = {
            "data": [{"scale": np.array(1.0, dtype=np.float32), "zero_point": np.array(0, dtype=np.int8)}]
        }
    q = quantize_qdq(
        fmodel,
        samples.calibration_samples(fmodel, image_input=image_input),
        per_channel=per_channel,
        op_types=["Conv", "Relu", "GlobalAveragePool", "Flatten", "Gemm"],
        extra_options=extra,
    )
    if image_input:
        samples._make_input_int8(q, "data")
    return q


def quantize_image_input(float_model: onnx.ModelProto, *, per_channel: bool, name: str = "data") -> onnx.ModelProto:
    """Quantize a model whose float input holds X_128 values and make that input int8 (as makertbin does)."""
    from bpuemu.host import samples

    rng = np.random.default_rng(2)
    shape = [d.dim_value for d in float_model.graph.input[0].type.tensor_type.shape.dim]
    data = [{name: rng.integers(-128, 128, shape).astype(np.float32)} for _ in range(4)]
    overrides = {name: [{"scale": np.array(1.0, dtype=np.float32), "zero_point": np.array(0, dtype=np.int8)}]}
    q = quantize_qdq(float_model, data, per_channel=per_channel, extra_options={"TensorQuantOverrides": overrides})
    samples._make_input_int8(q, name)
    return q


def per_channel_output_dequantize(q: onnx.ModelProto, output: str, seed: int = 3) -> onnx.ModelProto:
    """Turn the Q/DQ pair that produces ``output`` into a per-channel (axis=1) pair.

    quantize_static only writes per-axis parameters for weights; this gives the
    output DequantizeLinear (the ``_HzDequantize`` step) per-channel scales and
    zero points while keeping the graph a standard QDQ model.
    """
    q = onnx.ModelProto.FromString(q.SerializeToString())
    g = q.graph
    inits = {t.name: t for t in g.initializer}
    dq = next(n for n in g.node if n.op_type == "DequantizeLinear" and n.output[0] == output)
    qn = next(n for n in g.node if n.op_type == "QuantizeLinear" and n.output[0] == dq.input[0])
    channels = next(
        d.dim_value for vi in g.output if vi.name == output for d in vi.type.tensor_type.shape.dim[1:2]
    )
    rng = np.random.default_rng(seed)
    base = float(numpy_helper.to_array(inits[dq.input[1]]))
    scale = (base * rng.uniform(0.5, 1.5, channels)).astype(np.float32)
    zp = rng.integers(-20, 21, channels).astype(np.int8)
    new = {"out_pc_scale": scale, "out_pc_zp": zp}
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in new.items())
    for n in (qn, dq):
        n.input[1], n.input[2] = "out_pc_scale", "out_pc_zp"
        del n.attribute[:]
        n.attribute.append(helper.make_attribute("axis", 1))
    onnx.checker.check_model(q)
    return q


# --- compile, write, reference --------------------------------------------------

def build_bin(path, qmodel: onnx.ModelProto, name: str, specs=None):
    """compile_model + write_bin; returns the CompiledModel."""
    from bpuemu.host.compiler.partition import compile_model

    compiled = compile_model(qmodel, name, specs)
    write_bin(path, [compiled.model], compiled.blobs)
    return compiled


def reference_session(qmodel: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(qmodel.SerializeToString(), sess_options=session_options(), providers=["CPUExecutionProvider"])


def run_reference(qmodel: onnx.ModelProto, feed: Dict[str, np.ndarray]) -> List[np.ndarray]:
    return reference_session(qmodel).run(None, feed)


def image_to_model_input(image: np.ndarray, layout: str) -> np.ndarray:
    """uint8 image (NHWC or NCHW) -> the int8 NCHW X_128 tensor, computed independently of bpuemu."""
    x = (image.astype(np.int16) - 128).astype(np.int8)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if layout == "NHWC" else x


def nv12_to_model_input(nv12: np.ndarray, n: int, h: int, w: int) -> np.ndarray:
    """nv12 bytes -> yuv444_128 int8 NCHW: Y plane, UV upsampled 2x2 by replication, minus 128."""
    frames = nv12.reshape(n, h * w * 3 // 2)
    out = np.empty((n, 3, h, w), dtype=np.int16)
    for i, f in enumerate(frames):
        out[i, 0] = f[: h * w].reshape(h, w)
        uv = f[h * w :].reshape(h // 2, w // 2, 2)
        for c in range(2):
            out[i, 1 + c] = np.kron(uv[:, :, c].astype(np.int16), np.ones((2, 2), np.int16))
    return (out - 128).astype(np.int8)


def plan_kinds(model: model_pb2.Model) -> List[tuple]:
    return [(model_pb2.PlanStep.Kind.Name(s.kind), s.name) for s in model.plan]


class Case:
    """A float model, its quantized model, and the `.bin` compiled from it."""

    def __init__(self, float_model, qmodel, path, compiled):
        self.float_model = float_model
        self.qmodel = qmodel
        self.path = path
        self.compiled = compiled

    @property
    def model(self) -> model_pb2.Model:
        return self.compiled.model

    def step_names(self) -> List[str]:
        return [s.name for s in self.model.plan]


def build_case(directory, float_model: onnx.ModelProto, name: str, *, per_channel: bool, specs=None, qmodel=None) -> Case:
    qmodel = qmodel if qmodel is not None else quantize_qdq(float_model, per_channel=per_channel)
    path = os.path.join(os.fspath(directory), f"{name}.bin")
    compiled = build_bin(path, qmodel, name, specs)
    return Case(float_model, qmodel, path, compiled)
