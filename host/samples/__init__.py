"""Small sample CNNs, built in code, for the demo, the tests and the benchmarks.

``sample_float_model`` builds a float ONNX CNN with onnx.helper (a
MobileNet-like stem, depthwise block, global pooling, Gemm and Softmax).
``quantize_sample`` quantizes it the way makertbin's output looks: QDQ,
int8, per-channel weights, and -- for image inputs -- an int8 model input
(the X_128 intermediate type) feeding a 1x1 depthwise "HzPreprocess" conv that
applies ((x + 128) - mean) * scale. ``sample_bin`` compiles the result into a
`.bin` through the same container writer makertbin uses;
``write_sample_project`` writes a complete makertbin project (model, yaml,
calibration data). They are real models run by real onnxruntime sessions, not
mocks. ``bpuemu-demo`` (bpuemu.host.cli.bpuemu_demo) runs the whole flow on them.
"""
import os
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bpuemu.common.container import write_bin
from bpuemu.common.proto import model_pb2
from bpuemu.common.version import __version__

MEAN = np.array([123.68, 116.78, 103.94], dtype=np.float32)
SCALE = np.float32(0.017)


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def sample_float_model(
    height: int = 224,
    width: int = 224,
    channels: Sequence[int] = (16, 32),
    classes: int = 10,
    image_input: bool = True,
    seed: int = 0,
) -> onnx.ModelProto:
    """A float CNN. With ``image_input`` its input is X_128 (values -128..127, NCHW)."""
    rng = np.random.default_rng(seed)
    c1, c2 = channels
    nodes, inits = [], []

    def conv(name, x, cin, cout, k, stride=1, group=1, relu=True):
        w = rng.standard_normal((cout, cin // group, k, k)).astype(np.float32) * np.float32(np.sqrt(2.0 / (cin // group * k * k)))
        b = rng.standard_normal(cout).astype(np.float32) * np.float32(0.1)
        inits.extend([_init(f"{name}_w", w), _init(f"{name}_b", b)])
        out = f"{name}_out"
        nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [out], name=name,
                                      kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group))
        if relu:
            nodes.append(helper.make_node("Relu", [out], [f"{name}_relu"], name=f"{name}_relu"))
            return f"{name}_relu"
        return out

    x = "data"
    if image_input:
        # HzPreprocess as a depthwise 1x1 conv: weight = scale, bias = (128 - mean) * scale.
        w = np.full((3, 1, 1, 1), SCALE, dtype=np.float32)
        b = (128.0 - MEAN) * SCALE
        inits.extend([_init("HzPreprocess_w", w), _init("HzPreprocess_b", b.astype(np.float32))])
        nodes.append(helper.make_node("Conv", [x, "HzPreprocess_w", "HzPreprocess_b"], ["HzPreprocess_out"],
                                      name="HzPreprocess", kernel_shape=[1, 1], group=3))
        x = "HzPreprocess_out"
    x = conv("Conv_0", x, 3, c1, 3, stride=2)
    x = conv("Conv_1_dw", x, c1, c1, 3, group=c1)
    x = conv("Conv_2", x, c1, c2, 1)
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="GlobalAveragePool_0"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="Flatten_0", axis=1))
    fw = rng.standard_normal((classes, c2)).astype(np.float32) * np.float32(0.3)
    inits.extend([_init("fc_w", fw), _init("fc_b", np.zeros(classes, np.float32))])
    nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="Gemm_fc", transB=1))
    nodes.append(helper.make_node("Softmax", ["logits"], ["prob"], name="Softmax_prob", axis=1))
    graph = helper.make_graph(
        nodes, "sample_cnn",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, height, width])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, classes])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="bpuemu-samples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def text_image(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """An HxWx3 uint8 RGB picture of dark text on a light page: realistic calibration
    and test input for small CNNs and OCR models, made without any dataset."""
    from PIL import Image, ImageDraw

    bg = int(rng.integers(170, 256))
    img = Image.new("RGB", (w, h), (bg, bg, bg))
    d = ImageDraw.Draw(img)
    words = ["bpuemu", "X5 BPU", "hello", "12345", "quant", "onnx", "board", "Horizon", "OCR text"]
    for _ in range(int(rng.integers(1, 4)) * max(1, h // 48)):
        x, y = int(rng.integers(0, max(1, w - 60))), int(rng.integers(0, max(1, h - 12)))
        c = int(rng.integers(0, 90))
        d.text((x, y), str(rng.choice(words)), fill=(c, c, c))
    for _ in range(3):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        d.line((x0, y0, x0 + int(rng.integers(5, 40)), y0), fill=(int(rng.integers(0, 120)),) * 3, width=1)
    return np.asarray(img)


def write_sample_project(directory: str, size: int = 224, input_type_rt: str = "nv12", samples: int = 16,
                         seed: int = 0, prefix: str = "", march: str = "bayes-e") -> str:
    """A float sample CNN, its makertbin yaml (hb_compile's for a J6 ``march``) and calibration data in
    ``directory``; returns the yaml path.

    The model is trained on RGB NCHW normalised with ImageNet mean/scale, which
    the yaml moves into HzPreprocess; calibration samples are RGB NCHW uint8
    text pages, as ptq_guide's "Preparing Calibration Data" describes.
    """
    import yaml

    os.makedirs(directory, exist_ok=True)
    prefix = prefix or f"sample_{size}x{size}_{input_type_rt}"
    onnx_path = os.path.join(directory, "sample_float.onnx")
    onnx.save(sample_float_model(size, size, image_input=False, seed=seed), onnx_path)
    cal_dir = os.path.join(directory, "calibration_data_rgb")
    os.makedirs(cal_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(samples):
        np.ascontiguousarray(text_image(size, size, rng).transpose(2, 0, 1)[None]).tofile(os.path.join(cal_dir, f"{i:04d}.rgb"))
    inputs = {"input_name": "data", "input_type_train": "rgb", "input_layout_train": "NCHW",
              "input_type_rt": input_type_rt, "norm_type": "data_mean_and_scale",
              "mean_value": " ".join(str(float(v)) for v in MEAN), "scale_value": str(float(SCALE)),
              "input_shape": f"1x3x{size}x{size}"}
    if input_type_rt not in ("nv12", "featuremap"):
        inputs["input_layout_rt"] = "NHWC"
    j6 = march.startswith("nash")
    if j6:   # the J6 flow keeps the model's layout and has no O3 (bpuemu.common.march)
        inputs.pop("input_layout_train")
        inputs.pop("input_layout_rt", None)
    doc = {
        "model_parameters": {"onnx_model": "sample_float.onnx", "march": march,
                             "output_model_file_prefix": prefix, "working_dir": "model_output"},
        "input_parameters": inputs,
        "calibration_parameters": {"cal_data_dir": "calibration_data_rgb", "cal_data_type": "uint8",
                                   "calibration_type": "default"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O2" if j6 else "O3"},
    }
    path = os.path.join(directory, f"{prefix}_config.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def calibration_samples(model: onnx.ModelProto, count: int = 8, seed: int = 1, image_input: bool = True) -> List[Dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    if image_input:
        return [{"data": rng.integers(-128, 128, shape).astype(np.float32)} for _ in range(count)]
    return [{"data": rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


class _Reader:
    def __init__(self, samples):
        self._it = iter(samples)

    def get_next(self):
        return next(self._it, None)


def quantize_sample(float_model: onnx.ModelProto, samples: List[Dict[str, np.ndarray]], image_input: bool = True) -> onnx.ModelProto:
    """QDQ-quantize with onnxruntime; for image inputs, make the model input int8."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    extra = {"ActivationSymmetric": False, "WeightSymmetric": True}
    if image_input:
        # The input is X_128: int8 values exactly, so scale 1 / zero point 0 make Q an identity.
        extra["TensorQuantOverrides"] = {"data": [{"scale": np.array(1.0, dtype=np.float32), "zero_point": np.array(0, dtype=np.int8)}]}
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "quant.onnx")
        onnx.save(float_model, src)
        quantize_static(
            src, dst, _Reader(samples), quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
            op_types_to_quantize=["Conv", "Relu", "GlobalAveragePool", "Flatten", "Gemm"],
            extra_options=extra,
        )
        quant = onnx.load(dst)
    if image_input:
        _make_input_int8(quant, "data")
    return quant


def _make_input_int8(model: onnx.ModelProto, name: str) -> None:
    """Drop the QuantizeLinear on ``name`` so the model takes the int8 tensor itself."""
    g = model.graph
    q = next(n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == name)
    qout = q.output[0]
    g.node.remove(q)
    for n in g.node:
        for i, inp in enumerate(n.input):
            if inp == qout:
                n.input[i] = name
    for vi in g.input:
        if vi.name == name:
            vi.type.tensor_type.elem_type = TensorProto.INT8


def image_input_spec(model: onnx.ModelProto, input_type_rt: str = "rgb", input_layout_rt: str = "NHWC") -> model_pb2.InputSpec:
    vi = model.graph.input[0]
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    return model_pb2.InputSpec(
        name=vi.name,
        input_type_rt=input_type_rt,
        input_layout_rt="" if input_type_rt == "nv12" else input_layout_rt,
        input_space_and_range="regular",
        model_layout="NCHW",
        model_dtype="int8",
        model_shape=shape,
        plan_tensor=vi.name,
    )


def sample_build_info(name: str, input_type_rt: str) -> model_pb2.BuildInfo:
    info = model_pb2.BuildInfo()
    info.deps.add(key="hb_mapper version", value=__version__)
    info.deps.add(key="bpuemu compiler", value=__version__)
    info.model_parameters.add(key="onnx_model", value="<built in code by bpuemu.host.samples>")
    info.model_parameters.add(key="BPU march", value="bayes-e")
    info.model_parameters.add(key="output_model_file_prefix", value=name)
    ip = info.input_parameters.add(input_name="data")
    ip.params.add(key="input_type_rt", value=input_type_rt)
    info.calibration_parameters.add(key="calibration_type", value="max (onnxruntime MinMax)")
    info.compiler_parameters.add(key="optimize_level", value="O3")
    return info


def sample_bin(
    path: str,
    input_type_rt: str = "rgb",
    input_layout_rt: str = "NHWC",
    height: int = 224,
    width: int = 224,
    name: Optional[str] = None,
    quantized_path: Optional[str] = None,
    seed: int = 0,
) -> str:
    """Build, quantize and compile a sample CNN into ``path``; returns its SHA-256.

    ``input_type_rt`` is rgb/bgr/yuv444/nv12/gray-free image types or
    ``featuremap`` (float input quantized by an ``_HzQuantize`` step).
    """
    from bpuemu.host.compiler.partition import compile_model, featuremap_specs

    image = input_type_rt != "featuremap"
    name = name or f"sample_{height}x{width}_{input_type_rt}"
    fmodel = sample_float_model(height, width, image_input=image, seed=seed)
    qmodel = quantize_sample(fmodel, calibration_samples(fmodel, image_input=image), image_input=image)
    if quantized_path:
        onnx.save(qmodel, quantized_path)
    specs = [image_input_spec(qmodel, input_type_rt, input_layout_rt)] if image else featuremap_specs(qmodel)
    compiled = compile_model(qmodel, name, specs, build_info=sample_build_info(name, input_type_rt))
    from bpuemu.host.compiler.timing.estimate import annotate

    annotate(compiled.model, compiled.blobs)   # as makertbin: the X5 timing in the .bin
    return write_bin(path, [compiled.model], compiled.blobs)
