"""`.bin` models for the model-tool tests, made by ``hb_mapper makertbin`` from small float ONNX models.

Each case is a float model built with onnx.helper, a yaml config and random
calibration data in a temp directory, converted with
``makertbin_from_config`` -- the same path a user's ``hb_mapper makertbin``
takes -- so the tools are tested on the `.bin` files the toolchain really
writes, with full BuildInfo:

    fm           sample CNN, featuremap input (an _HzQuantize step), Softmax on the CPU at the
                 output, compiled with debug: True
    image        sample CNN, nv12 input (Preprocess does the colour conversion), debug: False
    residual     conv/add/relu/conv, featuremap; its output is an _HzDequantize step
    cpu_middle   conv -> Softmax (CPU) -> conv: the Softmax is not adjacent to an output
    transpose_in NHWC featuremap input through a Transpose that runs on the CPU
    reshape_out  conv -> Reshape on the CPU at the output
"""
import os
from typing import Dict, List, Sequence

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

OPSET = 13


def _conv(name, x, cin, cout, k, nodes, inits, rng, relu=True, out=""):
    w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
    b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
    inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
    conv_out = out if (out and not relu) else f"{name}_out"
    nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [conv_out], name=name,
                                  kernel_shape=[k, k], pads=[k // 2] * 4))
    if not relu:
        return conv_out
    nodes.append(helper.make_node("Relu", [conv_out], [out or f"{name}_relu"], name=f"{name}_relu"))
    return out or f"{name}_relu"


def _model(name, nodes, inits, inputs: Dict[str, Sequence[int]], outputs: Dict[str, Sequence[int]]) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name,
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in outputs.items()],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="bpuemu-tests")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def residual_model(seed=0) -> onnx.ModelProto:
    rng, nodes, inits = np.random.default_rng(seed), [], []
    a = _conv("Conv_in", "x", 3, 8, 3, nodes, inits, rng)
    r = _conv("Conv_res", a, 8, 8, 3, nodes, inits, rng, relu=False)
    nodes.append(helper.make_node("Add", [a, r], ["sum"], name="Add_skip"))
    nodes.append(helper.make_node("Relu", ["sum"], ["sum_relu"], name="Relu_skip"))
    _conv("Conv_out", "sum_relu", 8, 8, 1, nodes, inits, rng, relu=False, out="y")
    return _model("residual", nodes, inits, {"x": [1, 3, 16, 16]}, {"y": [1, 8, 16, 16]})


def cpu_middle_model(seed=0) -> onnx.ModelProto:
    rng, nodes, inits = np.random.default_rng(seed), [], []
    a = _conv("Conv_a", "x", 3, 8, 3, nodes, inits, rng)
    nodes.append(helper.make_node("Softmax", [a], ["sm"], name="Softmax_mid", axis=1))
    _conv("Conv_b", "sm", 8, 8, 3, nodes, inits, rng, relu=False, out="y")
    return _model("cpu_middle", nodes, inits, {"x": [1, 3, 16, 16]}, {"y": [1, 8, 16, 16]})


def transpose_in_model(seed=0) -> onnx.ModelProto:
    rng, nodes, inits = np.random.default_rng(seed), [], []
    nodes.append(helper.make_node("Transpose", ["x"], ["xt"], name="Transpose_in", perm=[0, 3, 1, 2]))
    a = _conv("Conv_a", "xt", 3, 4, 3, nodes, inits, rng)
    _conv("Conv_b", a, 4, 4, 1, nodes, inits, rng, relu=False, out="y")
    return _model("transpose_in", nodes, inits, {"x": [1, 8, 8, 3]}, {"y": [1, 4, 8, 8]})


def reshape_out_model(seed=0) -> onnx.ModelProto:
    rng, nodes, inits = np.random.default_rng(seed), [], []
    a = _conv("Conv_a", "x", 3, 4, 3, nodes, inits, rng)
    b = _conv("Conv_b", a, 4, 4, 1, nodes, inits, rng, relu=False)
    inits.append(numpy_helper.from_array(np.array([1, 256], np.int64), "flat_shape"))
    nodes.append(helper.make_node("Reshape", [b, "flat_shape"], ["y"], name="Reshape_out"))
    return _model("reshape_out", nodes, inits, {"x": [1, 3, 8, 8]}, {"y": [1, 256]})


def _write_cal(directory: str, shape: Sequence[int], rng, count: int = 4, image: bool = False) -> str:
    os.makedirs(directory, exist_ok=True)
    for i in range(count):
        data = rng.uniform(0, 255, shape) if image else rng.standard_normal(shape)
        data.astype(np.float32).tofile(os.path.join(directory, f"{i:03d}.bin"))
    return directory


def makertbin(directory: str, float_model: onnx.ModelProto, prefix: str, *, input_type_rt: str = "featuremap",
              input_layout_train: str = "NCHW", debug: bool = False, seed: int = 0) -> str:
    """Convert ``float_model`` with hb_mapper makertbin's library entry; returns the `.bin` path."""
    from bpuemu.host.mapper.makertbin import makertbin_from_config

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    vi = float_model.graph.input[0]
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    onnx_path = os.path.join(directory, f"{prefix}.onnx")
    onnx.save(float_model, onnx_path)
    image = input_type_rt != "featuremap"
    inputs = {
        "input_name": vi.name,
        "input_type_train": "rgb" if image else "featuremap",
        "input_layout_train": input_layout_train,
        "input_type_rt": input_type_rt,
        "input_shape": "x".join(map(str, shape)),
        "norm_type": "data_mean_and_scale" if image else "no_preprocess",
    }
    if image:
        inputs.update({"mean_value": "123.68 116.78 103.94", "scale_value": "0.017"})
    doc = {
        "model_parameters": {"onnx_model": onnx_path, "march": "bayes-e", "output_model_file_prefix": prefix,
                             "working_dir": os.path.join(directory, "model_output")},
        "input_parameters": inputs,
        "calibration_parameters": {"cal_data_dir": _write_cal(os.path.join(directory, f"cal_{prefix}"), shape, rng,
                                                              image=image),
                                   "cal_data_type": "float32", "calibration_type": "max"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3", "debug": debug},
    }
    cfg = os.path.join(directory, f"{prefix}.yaml")
    with open(cfg, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return makertbin_from_config(cfg).bin


def build_all(directory: str) -> Dict[str, str]:
    from bpuemu.host.samples import sample_float_model

    cases = {
        "fm": (sample_float_model(32, 32, image_input=False), {"debug": True}),
        "image": (sample_float_model(32, 32, image_input=False, seed=1), {"input_type_rt": "nv12"}),
        "residual": (residual_model(), {}),
        "cpu_middle": (cpu_middle_model(), {}),
        "transpose_in": (transpose_in_model(), {"input_layout_train": "NHWC"}),
        "reshape_out": (reshape_out_model(), {}),
    }
    return {name: makertbin(os.path.join(directory, name), m, name, **kw) for name, (m, kw) in cases.items()}


def random_inputs(model, seed: int = 0) -> List[np.ndarray]:
    """Random inputs in input_type_rt form for a manifest Model."""
    from bpuemu.common.input_types import random_rt_input

    rng = np.random.default_rng(seed)
    return [random_rt_input(s, rng) for s in model.input_specs]


def run_tool(main, args, capsys):
    """Run a tool's entry point as the console script does: (exit code, stdout, stderr)."""
    import pytest

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err
