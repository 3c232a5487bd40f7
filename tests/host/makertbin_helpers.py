"""Builders for makertbin tests: float models, yaml configs, calibration data, text images."""
import os
from typing import Dict, Optional

import numpy as np
import onnx
import yaml

from bpuemu.host.samples import sample_float_model, text_image  # noqa: F401 (re-exported for tests)


def write_cal_dir(directory: str, arrays) -> str:
    os.makedirs(directory, exist_ok=True)
    for i, a in enumerate(arrays):
        np.ascontiguousarray(a).tofile(os.path.join(directory, f"{i:04d}.bin"))
    return directory


def write_config(path: str, onnx_model: str, prefix: str, working_dir: str, inputs: Dict[str, dict],
                 calibration: Optional[dict] = None, compiler: Optional[dict] = None, model_extra: Optional[dict] = None) -> str:
    """A makertbin yaml. ``inputs``: input name -> input_parameters values (per input)."""
    names = list(inputs)
    keys = sorted({k for v in inputs.values() for k in v})
    cal_keys = ("cal_data_dir", "cal_data_type")
    input_parameters = {"input_name": ";".join(names)}
    cal = {"calibration_type": "default"}
    for k in keys:
        (cal if k in cal_keys else input_parameters)[k] = ";".join(str(inputs[n].get(k, "None")) for n in names)
    cal.update(calibration or {})
    doc = {
        "model_parameters": {"onnx_model": onnx_model, "march": "bayes-e", "output_model_file_prefix": prefix,
                             "working_dir": working_dir, **(model_extra or {})},
        "input_parameters": input_parameters,
        "calibration_parameters": cal,
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3", **(compiler or {})},
    }
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def sample_project(tmp, input_type_rt="nv12", input_layout_rt="NHWC", size=32, samples=8, calibration=None,
                   prefix="sample", seed=0):
    """A float sample CNN trained on RGB NCHW (normalised inside HzPreprocess), its yaml and calibration data."""
    tmp = str(tmp)
    rng = np.random.default_rng(seed)
    model = sample_float_model(size, size, image_input=False, seed=seed)
    onnx_path = os.path.join(tmp, "float.onnx")
    onnx.save(model, onnx_path)
    cal = write_cal_dir(os.path.join(tmp, "cal"),
                        [text_image(size, size, rng).transpose(2, 0, 1)[None] for _ in range(samples)])
    inp = {"input_type_train": "rgb", "input_layout_train": "NCHW", "input_type_rt": input_type_rt,
           "norm_type": "data_mean_and_scale", "mean_value": "123.68 116.78 103.94", "scale_value": "0.017",
           "input_shape": f"1x3x{size}x{size}", "cal_data_dir": cal, "cal_data_type": "uint8"}
    if input_type_rt != "nv12":
        inp["input_layout_rt"] = input_layout_rt
    cfg = write_config(os.path.join(tmp, "config.yaml"), onnx_path, prefix, os.path.join(tmp, "model_output"),
                       {"data": inp}, calibration=calibration)
    return cfg, onnx_path
