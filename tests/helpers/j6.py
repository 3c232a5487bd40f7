"""A tiny J6 project compiled by hb_compile: the `.hbm`, its `.bc` files, for board and host tests.

``compile_tiny(directory, march, input_type_rt)``: data (1x3x8x12) -> Conv -> Relu -> Conv, compiled for
``march`` with an nv12 (12 pixels wide: its rows pad to the march's stride) or featuremap input;
``matmul_tail``: a MatMul after the last Conv, so the model ends in int8 (a tail Conv outputs int32 on J6,
with no Dequantize to remove).
"""
import os

import numpy as np
import yaml
from onnx import TensorProto, helper, numpy_helper, save

SHAPE = (1, 3, 8, 12)


def tiny_onnx(path: str, seed: int = 0, matmul_tail: bool = False) -> str:
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.normal(0, 0.5, (2, 4, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.1, (2,)).astype(np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["data", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2")]
    if matmul_tail:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (SHAPE[3], SHAPE[3])).astype(np.float32), "w3"))
        nodes[-1].output[0] = "c2_conv"
        nodes.append(helper.make_node("MatMul", ["c2_conv", "w3"], ["c2"], name="matmul3"))
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("data", TensorProto.FLOAT, list(SHAPE))],
                              [helper.make_tensor_value_info("c2", TensorProto.FLOAT, [1, 2, SHAPE[2], SHAPE[3]])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, path)
    return path


def tiny_yaml(directory: str, march: str = "nash-e", input_type_rt: str = "nv12", matmul_tail: bool = False,
              **model_parameters) -> str:
    """The float model, 3 calibration samples and the hb_compile yaml in ``directory``; returns the yaml."""
    directory = os.fspath(directory)
    model = tiny_onnx(os.path.join(directory, "tiny.onnx"), matmul_tail=matmul_tail)
    cal = os.path.join(directory, "cal")
    os.makedirs(cal, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(3):
        np.save(os.path.join(cal, f"{i}.npy"), rng.normal(0, 1, SHAPE).astype(np.float32))
    image = input_type_rt != "featuremap"
    ip = {"input_name": "data", "input_type_train": "rgb" if image else "featuremap", "input_type_rt": input_type_rt,
          "norm_type": "data_scale" if image else "no_preprocess"}
    if image:
        ip["scale_value"] = "0.0078125"
    doc = {"model_parameters": {"onnx_model": model, "march": march, "output_model_file_prefix": "tiny",
                                "working_dir": os.path.join(directory, "model_output"), **model_parameters},
           "input_parameters": ip,
           "calibration_parameters": {"calibration_type": "default", "cal_data_dir": cal},
           "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O2"}}
    path = os.path.join(directory, "config.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def compile_tiny(directory, march: str = "nash-e", input_type_rt: str = "nv12", matmul_tail: bool = False,
                 **model_parameters):
    """hb_compile's Artifacts (``.bin`` is the .hbm, ``.quantized`` the ptq model, ``.bc`` ...) in ``directory``;
    ``model_parameters``: more yaml keys of that group (``remove_node_type="Dequantize"``)."""
    from bpuemu.host.mapper.hb_compile import compile_from_config

    cwd = os.getcwd()
    os.chdir(directory)   # hb_compile.log goes to the directory it runs from
    try:
        return compile_from_config(tiny_yaml(directory, march, input_type_rt, matmul_tail, **model_parameters))
    finally:
        os.chdir(cwd)
