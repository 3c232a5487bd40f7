"""Builders for hb_compile tests: tiny float models (onnx.helper), calibration data, J6 yaml configs."""
import os
from typing import Dict, Optional, Sequence

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper


def conv_model(path: str, shape=(1, 3, 8, 8), relu_tail: bool = False, opset: int = 13, ir_version: int = 8,
               input_name: str = "data", matmul: bool = False, seed: int = 0) -> str:
    """data -> Conv(3->4) -> Relu -> Conv(4->2) [-> Relu] [-> Reshape -> MatMul]: a tiny NCHW CNN."""
    rng = np.random.default_rng(seed)
    c = shape[1]
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, c, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.normal(0, 0.5, (2, 4, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.1, (2,)).astype(np.float32), "b2")]
    nodes = [helper.make_node("Conv", [input_name, "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2")]
    out, out_shape = "c2", [shape[0], 2, shape[2], shape[3]]
    if relu_tail:
        nodes.append(helper.make_node("Relu", ["c2"], ["r2"], name="relu_tail"))
        out = "r2"
    if matmul:
        hw = shape[2] * shape[3]
        inits += [numpy_helper.from_array(np.array([shape[0], 2, hw], np.int64), "rs"),
                  numpy_helper.from_array(rng.normal(0, 0.2, (hw, 5)).astype(np.float32), "wm")]
        nodes += [helper.make_node("Reshape", [out, "rs"], ["flat"], name="reshape"),
                  helper.make_node("MatMul", ["flat", "wm"], ["mm"], name="matmul")]
        out, out_shape = "mm", [shape[0], 2, 5]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    onnx.save(model, path)
    return path


def cal_dir(directory: str, shapes: Dict[str, Sequence[int]], samples: int = 3, seed: int = 0,
            dtype=np.float32) -> Dict[str, str]:
    """One directory of .npy samples per input; returns input name -> directory."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        d = os.path.join(directory, f"cal_{name}")
        os.makedirs(d, exist_ok=True)
        for i in range(samples):
            np.save(os.path.join(d, f"{i}.npy"), rng.normal(0, 1, shape).astype(dtype))
        out[name] = d
    return out


def write_yaml(path: str, model: str, march: str = "nash-e", prefix: str = "tiny", inputs: Optional[Dict[str, dict]] = None,
               calibration: Optional[dict] = None, compiler: Optional[dict] = None, model_extra: Optional[dict] = None,
               input_extra: Optional[dict] = None) -> str:
    """An hb_compile yaml: the four groups; ``inputs``: name -> per-input values (featuremap by default)."""
    inputs = inputs or {"data": {}}
    names = list(inputs)
    per = {k: ";".join(str(inputs[n].get(k, d)) for n in names)
           for k, d in (("input_type_train", "featuremap"), ("input_type_rt", "featuremap"),
                        ("norm_type", "no_preprocess"))}
    shapes = [inputs[n].get("input_shape") for n in names]
    ip = {"input_name": ";".join(names), **per}
    if any(shapes):
        ip["input_shape"] = ";".join(s or "None" for s in shapes)
    ip.update(input_extra or {})
    cal = {"calibration_type": "default"}
    dirs = [inputs[n].get("cal_data_dir") for n in names]
    if any(dirs):
        cal["cal_data_dir"] = ";".join(dirs)
    cal.update(calibration or {})
    doc = {
        "model_parameters": {"onnx_model": model, "march": march, "output_model_file_prefix": prefix,
                             "working_dir": "model_output", **(model_extra or {})},
        "input_parameters": ip,
        "calibration_parameters": cal,
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O2", **(compiler or {})},
    }
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def tiny_project(tmp, march: str = "nash-e", **model_kw) -> str:
    """A tiny conv model, 3 calibration samples and its hb_compile yaml in ``tmp``; returns the yaml's path."""
    tmp = str(tmp)
    model = conv_model(os.path.join(tmp, "tiny.onnx"), **model_kw)
    shape = model_kw.get("shape", (1, 3, 8, 8))
    cal = cal_dir(tmp, {"data": shape})
    return write_yaml(os.path.join(tmp, "config.yaml"), model, march, inputs={"data": {"cal_data_dir": cal["data"]}})
