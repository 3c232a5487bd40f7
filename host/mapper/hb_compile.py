"""hb_compile (the J6 flow): a yaml or --fast-perf -> a ConvertJob for a nash-* march -> the pipeline.

    compile_from_config(path)  ->  load_compile_config  ->  compile_config(ccfg):
        read_float_model(cfg)               the ONNX float model, read once
        check_onnx_version(model, march)    10 <= opset <= 19, ir_version <= 9 (ptq_faq_j6)
        complete_config(cfg, ...)           names and shapes the yaml left to the model
        check_custom_ops(cfg, model)        standard ONNX operators only
        log_input_parameters(cfg)           the input_parameters info group (input_shape, input_batch)
        check_shape_inference(job)          shape_inference_fail.onnx in working_dir when it fails
        run(job)                            the pipeline; the march picks the J6 artifacts

The pipeline, calibration, placement and compile are the X5 flow's; what the
J6 march changes is data (bpuemu.common.march) the job carries.
"""
import json
import logging
import os
from typing import Dict, Optional, Tuple

import onnx

from bpuemu.common.errors import InvalidInput
from bpuemu.common.march import march as march_of
from bpuemu.host.config.j6 import CompileConfig, load_compile_config, parse_compile_config
from bpuemu.host.config.loader import complete_config
from bpuemu.host.convert.pipeline import Artifacts, ConvertJob, load_float_model, run
from bpuemu.host.mapper.makertbin import (
    FAST_PERF_REMOVED_TYPES,
    check_custom_ops,
    fast_perf_inputs,
    float_inputs,
    job_from_config,
    read_float_model,
)
from bpuemu.host.onnxgraph import default_opset, load_onnx

log = logging.getLogger("bpuemu.host.makertbin")

SHAPE_INFERENCE_FAIL = "shape_inference_fail.onnx"


def compile_from_config(config_path: str) -> Artifacts:
    return compile_config(load_compile_config(config_path))


def check_onnx_version(model: onnx.ModelProto, march_name: str, source: str = "the model") -> None:
    """The ONNX versions the march's toolchain accepts (J6: 10 <= opset <= 19, ir_version <= 9)."""
    m = march_of(march_name)
    lo, hi = m.opset_range
    opset = default_opset(model)
    if not lo <= opset <= hi:
        raise InvalidInput(f"{source} has opset {opset}; {m.flow.convert_command} for {m.name} accepts "
                           f"{lo} <= opset_version <= {hi}", hint=f"re-export the model with an opset from {lo} to {hi}")
    if model.ir_version > m.max_ir_version:
        raise InvalidInput(f"{source} has ir_version {model.ir_version}; {m.flow.convert_command} for {m.name} accepts "
                           f"ir_version <= {m.max_ir_version}", hint="re-export it with an older onnx, or set ir_version")


def compile_config(ccfg: CompileConfig, float_model: Optional[onnx.ModelProto] = None) -> Artifacts:
    cfg = ccfg.config
    if float_model is None:
        float_model = read_float_model(cfg)
    if float_model is not None:
        check_onnx_version(float_model, cfg.model.march, os.path.basename(cfg.model.onnx_model or "the model"))
    cfg = complete_config(cfg, float_inputs(cfg, float_model))
    check_custom_ops(cfg, float_model)
    if ccfg.calibration_line:
        log.info(ccfg.calibration_line)
    log_input_parameters(cfg)
    job = j6_job(ccfg, cfg, float_model)
    check_shape_inference(job)
    return run(job)


def j6_job(ccfg: CompileConfig, cfg, float_model: Optional[onnx.ModelProto]) -> ConvertJob:
    """The X5 job of the config with the J6 fields: quant_config, dump_all_layers_output, and
    the build info's inputs in the `.hbm`'s order (by name)."""
    job = job_from_config(cfg, float_model)
    job.quant_config = ccfg.quant_config
    job.dump_all_layers_output = ccfg.dump_all_layers_output
    info = job.build_info
    for kv in info.deps:
        if kv.key == "hb_mapper version":
            kv.key = "hb_compile version"
    _drop(info.model_parameters, ("layer_out_dump",))   # X5 keys; the J6 flow keeps the model's layout
    if ccfg.dump_all_layers_output:
        info.model_parameters.add(key="debug_mode", value=ccfg.debug_mode)
    for ip in info.input_parameters:
        _drop(ip.params, ("input_layout_rt", "input_layout_train"))
    if ccfg.quant_config is not None:
        value = ccfg.quant_config if isinstance(ccfg.quant_config, str) else json.dumps(ccfg.quant_config, sort_keys=True)
        info.calibration_parameters.add(key="quant_config", value=value)
    ordered = sorted(info.input_parameters, key=lambda ip: ip.input_name)
    copies = [type(ip)() for ip in ordered]
    for c, ip in zip(copies, ordered):
        c.CopyFrom(ip)
    del info.input_parameters[:]
    info.input_parameters.extend(copies)
    for ip in info.input_parameters:
        if not any(kv.key == "input_batch" for kv in ip.params):
            ip.params.add(key="input_batch", value=str(cfg.input_batch))
    return job


def _drop(pairs, keys) -> None:
    kept = [(kv.key, kv.value) for kv in pairs if kv.key not in keys]
    del pairs[:]
    for k, v in kept:
        pairs.add(key=k, value=v)


def log_input_parameters(cfg) -> None:
    """The input_parameters info group of hb_compile.log: the input_shape and input_batch in effect."""
    from bpuemu.host.config import config_info

    log.info("############# input_parameters info #############")
    for name, pairs in config_info(cfg).input_parameters:
        log.info("---------input info : %s ---------", name)
        keys = set()
        for k, v in pairs:
            if k in ("input_layout_rt", "input_layout_train"):
                continue  # the J6 flow keeps the model's layout
            keys.add(k)
            log.info("%-20s: %s", k, v)
        if "input_batch" not in keys:
            log.info("%-20s: %s", "input_batch", cfg.input_batch)
        log.info("---------input info : %s end -------", name)


def check_shape_inference(job: ConvertJob) -> None:
    """ONNX shape inference must go through the float model at the configured shapes; when it fails,
    the model is saved as shape_inference_fail.onnx in working_dir (for a bug report) and the run stops."""
    if job.prototxt:
        return
    source = job.float_model if job.float_model is not None else load_onnx(job.onnx_model, "onnx_model")
    model = onnx.ModelProto.FromString(source.SerializeToString())
    try:
        fixed = load_float_model(model, job.inputs, job.output_nodes, source=job.onnx_model)
        onnx.shape_inference.infer_shapes(fixed, strict_mode=True)
    except InvalidInput:
        raise
    except Exception as exc:  # onnx raises InferenceError, ValidationError, RuntimeError
        os.makedirs(job.working_dir, exist_ok=True)
        path = os.path.join(job.working_dir, SHAPE_INFERENCE_FAIL)
        from bpuemu.common.atomic import write_file_atomic

        write_file_atomic(path, source.SerializeToString())
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
        raise InvalidInput(f"shape inference failed on {os.path.basename(job.onnx_model)}: {first} "
                           f"(the model is saved as {path})",
                           hint="check the model with onnx.checker / onnxruntime; send the model and hb_compile.log "
                                "for analysis") from None


def compile_fast_perf(model_path: str, march_name: str, input_shapes: Dict[str, Tuple[int, ...]],
                      prototxt: str = "") -> Artifacts:
    """hb_compile --fast-perf: featuremap inputs at the model's layout, calibration skipped, the march's
    highest optimize level, the CPU nodes at the model's beginning and end removed."""
    model = None if prototxt else load_onnx(model_path, "onnx_model")
    ccfg = fast_perf_config(model_path, march_name, input_shapes, prototxt=prototxt, model=model)
    return compile_config(ccfg, model)


def fast_perf_config(model_path: str, march_name: str, input_shapes: Dict[str, Tuple[int, ...]],
                     working_dir: str = "model_output", prototxt: str = "",
                     model: Optional[onnx.ModelProto] = None) -> CompileConfig:
    m = march_of(march_name)
    source, names, shapes = fast_perf_inputs(model_path, input_shapes, prototxt, model, shape_option="--input-shape")
    n = len(names)
    doc = {
        "model_parameters": {**source, "march": m.name, "working_dir": working_dir,
                             "output_model_file_prefix": os.path.splitext(os.path.basename(model_path))[0],
                             "remove_node_type": ";".join(FAST_PERF_REMOVED_TYPES)},
        "input_parameters": {"input_name": ";".join(names), "input_shape": ";".join(shapes),
                             "input_type_train": ";".join(["featuremap"] * n),
                             "input_type_rt": ";".join(["featuremap"] * n),
                             "norm_type": ";".join(["no_preprocess"] * n)},
        "calibration_parameters": {"calibration_type": "skip"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": m.optimize_levels[-1]},
    }
    return parse_compile_config(doc, os.getcwd(), model_inputs=[(nm, None) for nm in names])
