"""hb_mapper infer: run a conversion ONNX artifact on one input, save each output as ``<layer>_float.bin``.

Inputs are read the way makertbin reads calibration data (same config, so the
same input_type_train / layout / preprocess_on rules), turned into the model's
X_128 input exactly as for calibration, and run by HB_ONNXRuntime. With
model_parameters.layer_out_dump: True the outputs of every Conv are saved too.
"""
import logging
import os
from typing import Dict, List, Sequence, Tuple

import numpy as np
import onnx

from bpuemu.common.atomic import write_file_atomic
from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.host.config.loader import complete_config
from bpuemu.host.convert.caldata import CalInput, read_sample, to_model_inputs
from bpuemu.host.convert.pipeline import input_spec
from bpuemu.host.hb_onnxruntime import HB_ONNXRuntime
from bpuemu.host.mapper.makertbin import float_inputs, job_from_config
from bpuemu.host.onnxgraph import load_onnx, tensor_infos, with_outputs

log = logging.getLogger("bpuemu.host.infer")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name)


def with_layer_outputs(model: onnx.ModelProto, op_types=("Conv",)) -> onnx.ModelProto:
    """The model with every ``op_types`` node's output added as a graph output."""
    layers = [o for n in model.graph.node if n.op_type in op_types for o in n.output if o]
    return with_outputs(model, layers, tensor_infos(model))


def run_infer(config_path: str, model_file: str, image_files: Sequence[Tuple[str, str]], output_dir: str,
              model_type: str = "onnx", input_layout: str = "") -> List[str]:
    from bpuemu.host.config import load_config

    cfg = load_config(config_path, model_type=model_type)
    cfg = complete_config(cfg, float_inputs(cfg))
    job = job_from_config(cfg)
    given: Dict[str, str] = dict(image_files)
    unknown = set(given) - {ji.pre.name for ji in job.inputs}
    if unknown:
        raise InvalidInput(f"--image-file names {sorted(unknown)}, which are not inputs of the config "
                           f"({', '.join(ji.pre.name for ji in job.inputs)})")
    sample, specs = {}, []
    for ji in job.inputs:
        if ji.pre.name not in given:
            raise InvalidInput(f"no --image-file for input '{ji.pre.name}'")
        if not os.path.isfile(given[ji.pre.name]):
            raise NotFound(f"--image-file for input '{ji.pre.name}': file not found: {given[ji.pre.name]}")
        layout = input_layout or ji.pre.input_layout_train
        ci = CalInput(ji.pre.name, os.path.dirname(given[ji.pre.name]) or ".", ji.shape,
                      dtype=ji.cal.dtype if ji.cal else None, preprocess_on=cfg.calibration.preprocess_on,
                      input_type_train=ji.pre.input_type_train, input_layout_train=layout)
        sample[ji.pre.name] = read_sample(given[ji.pre.name], ci)
        specs.append(input_spec(ji))
    trains = {ji.pre.name: (ji.pre.input_type_train, ji.pre.input_layout_train) for ji in job.inputs}
    feed = to_model_inputs(sample, specs, trains)
    model = load_onnx(model_file)
    if cfg.model.layer_out_dump:
        model = with_layer_outputs(model)
    sess = HB_ONNXRuntime(onnx_model=model)
    outputs = sess.run(None, feed)
    os.makedirs(output_dir, exist_ok=True)
    written = []
    for name, value in zip(sess.output_names, outputs):
        path = os.path.join(output_dir, f"{_safe(name)}_float.bin")
        write_file_atomic(path, np.ascontiguousarray(value, dtype=np.float32).tobytes())
        written.append(path)
        log.info("%s: shape %s -> %s", name, list(np.shape(value)), path)
    return written
