"""Models and conversions for the accuracy debugger tests (tests/host/test_debugger.py).

``detector_model``: the shape DESIGN.md warns about. Two featuremap inputs are
added, a Conv trunk feeds two heads, box coordinates in pixels (sigmoid x 640)
and 0-1 class scores (sigmoid), joined by one Concat and reshaped into the
output ``detections`` [1, H*W, 6]. Under one int8 scale (640/127 = 5.04) every
score rounds to 0.
"""
import os
from typing import Dict, Optional

import numpy as np
import onnx
import yaml

from bpuemu.host.mapper.makertbin import makertbin_from_config

from makertbin_helpers import write_cal_dir, write_config
from quant_models import Builder

SIZE = 16


def detector_model(size: int = SIZE, seed: int = 3) -> onnx.ModelProto:
    b = Builder(seed)
    s = b.node("Add", ["a", "b"], "Add_in")
    t = b.conv("Conv_trunk", s, 3, 8)
    t = b.conv("Conv_trunk2", t, 8, 8)
    box = b.conv("Conv_box", t, 8, 4, k=1, relu=False)
    box = b.node("Sigmoid", [box], "Sigmoid_box")
    box = b.node("Mul", [box, b.init("pixels", np.array(640.0, np.float32))], "Mul_pixels")
    score = b.conv("Conv_score", t, 8, 2, k=1, relu=False)
    score = b.node("Sigmoid", [score], "Sigmoid_score")
    cat = b.node("Concat", [box, score], "Concat_det", axis=1)
    flat = b.node("Reshape", [cat, b.init("shape", np.array([1, 6, size * size], np.int64))], "Reshape_det")
    b.node("Transpose", [flat], "Transpose_det", out="detections", perm=[0, 2, 1])
    return b.model("detector", {"a": [1, 3, size, size], "b": [1, 3, size, size]}, {"detections": [1, size * size, 6]})


def featuremaps(count: int, seed: int, size: int = SIZE):
    rng = np.random.default_rng(seed)
    return [{n: rng.standard_normal((1, 3, size, size)).astype(np.float32) for n in "ab"} for _ in range(count)]


def write_project(directory: str, model: onnx.ModelProto, prefix: str, samples: int = 8,
                  node_info: Optional[Dict[str, dict]] = None, calibration_type: str = "max") -> str:
    """The float model, calibration data and a makertbin yaml (debug_mode: dump_calibration_data); the yaml's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{prefix}.onnx")
    onnx.save(model, path)
    feeds = featuremaps(samples, seed=11)
    inputs = {}
    for n in "ab":
        cal = write_cal_dir(os.path.join(directory, f"cal_{n}"), [f[n] for f in feeds])
        inputs[n] = {"input_type_train": "featuremap", "input_layout_train": "NCHW", "input_type_rt": "featuremap",
                     "input_layout_rt": "NCHW", "norm_type": "no_preprocess", "input_shape": f"1x3x{SIZE}x{SIZE}",
                     "cal_data_dir": cal, "cal_data_type": "float32"}
    extra = {"debug_mode": "dump_calibration_data"}
    if node_info:
        extra["node_info"] = node_info
    return write_config(os.path.join(directory, f"{prefix}.yaml"), path, prefix, os.path.join(directory, "out"), inputs,
                        calibration={"calibration_type": calibration_type}, model_extra=extra)


def convert(directory: str, model: onnx.ModelProto, prefix: str, **kw):
    """makertbin (in process) on write_project's yaml; returns its Artifacts."""
    return makertbin_from_config(write_project(directory, model, prefix, **kw))
