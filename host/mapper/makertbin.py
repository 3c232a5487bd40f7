"""hb_mapper makertbin: from a typed config (or --fast-perf) to a ConvertJob, then run it.

    makertbin_from_config(path)  ->  load_config  ->  convert(cfg):
        read_float_model(cfg)                 the ONNX float model, read once for the whole run
        complete_config(cfg, float_inputs(cfg, m))    the config completed from the model's inputs
        check_custom_ops(cfg, m)              standard ONNX operators only
        run(job_from_config(cfg, m))          the pipeline (bpuemu.host.convert.pipeline)
"""
import logging
import os
from typing import Dict, List, Optional, Tuple, Union

import onnx

from bpuemu.common.errors import InvalidInput
from bpuemu.common.proto import model_pb2
from bpuemu.common.version import __version__
from bpuemu.host.config.loader import complete_config
from bpuemu.host.convert.caldata import CalInput
from bpuemu.host.onnxgraph import graph_inputs, load_onnx
from bpuemu.host.convert.pipeline import Artifacts, ConvertJob, JobInput, run
from bpuemu.host.convert.preprocess import InputPreprocess

log = logging.getLogger("bpuemu.host.makertbin")

FAST_PERF_PREFIX_SUFFIX = ""
#: What --fast-perf removes at the model's beginning and end (remove_node_type, repeated until none is left).
FAST_PERF_REMOVED_TYPES = ("Quantize", "Dequantize", "Transpose", "Cast", "Reshape")


def read_float_model(cfg) -> Optional[onnx.ModelProto]:
    """The ONNX float model a config names, read once for the whole run; None for a Caffe model
    (the pipeline converts it to ONNX at the yaml's input shapes)."""
    if cfg.model.model_type == "caffe":
        return None
    return load_onnx(cfg.model.onnx_model, "onnx_model")


def model_inputs(model: Union[str, onnx.ModelProto]) -> List[Tuple[str, List[Optional[int]]]]:
    """(name, shape) of a float model's inputs (a loaded model or its path), dynamic dims as None."""
    m = model if isinstance(model, onnx.ModelProto) else load_onnx(model, "onnx_model", load_external_data=False)
    return [(i.name, [d.dim_value if d.dim_value > 0 else None for d in i.type.tensor_type.shape.dim])
            for i in graph_inputs(m)]


def float_inputs(cfg, model: Optional[onnx.ModelProto] = None) -> List[Tuple[str, List[Optional[int]]]]:
    """(name, shape) of the float model a config names: the ONNX model (``model`` when already
    read), or the Caffe prototxt's inputs.

    A Caffe net is converted at the size the yaml's input_shape gives (Caffe
    nets reshape to their input, e.g. MTCNN's fully convolutional PNet); the
    prototxt's shape is the default.
    """
    if cfg.model.model_type != "caffe":
        return model_inputs(model if model is not None else cfg.model.onnx_model)
    from bpuemu.host.caffe import caffe_inputs

    found = caffe_inputs(cfg.model.prototxt)
    given = {(ic.name if ic.name is not None else found[i][0] if i < len(found) else None): ic.input_shape
             for i, ic in enumerate(cfg.inputs)}
    return [(name, list(given[name]) if given.get(name) else shape) for name, shape in found]


def _build_info(cfg) -> model_pb2.BuildInfo:
    from bpuemu.host.config import config_info

    info = model_pb2.BuildInfo()
    import onnxruntime

    for k, v in (("hb_mapper version", __version__), ("hbdk version", f"bpuemu-compiler {__version__}"),
                 ("hbdk runtime version", f"bpuemu-runtime {__version__}"), ("horizon_nn version", f"bpuemu-quant {__version__}"),
                 ("onnx version", onnx.__version__), ("onnxruntime version", onnxruntime.__version__)):
        info.deps.add(key=k, value=v)
    ci = config_info(cfg)
    for k, v in ci.model_parameters:
        info.model_parameters.add(key=k, value=v)
    for name, pairs in ci.input_parameters:
        ip = info.input_parameters.add(input_name=name)
        for k, v in pairs:
            ip.params.add(key=k, value=v)
    for k, v in ci.calibration_parameters:
        info.calibration_parameters.add(key=k, value=v)
    for k, v in ci.compiler_parameters:
        info.compiler_parameters.add(key=k, value=v)
    return info


def _quant_options(cfg):
    from bpuemu.host.quant import QuantOptions
    from bpuemu.host.quant.options import Int16Spec

    cal = cfg.calibration
    int16_nodes: Dict[str, Int16Spec] = {}
    for name, ni in cfg.model.node_info.items():
        ins = tuple(i for i, t in ni.input_types.items() if i != "all" and t == "int16")
        spec = Int16Spec(all_inputs=ni.input_types.get("all") == "int16", inputs=ins, output=ni.output_type == "int16")
        if spec.all_inputs or spec.inputs or spec.output:
            int16_nodes[name] = spec
    return QuantOptions.from_optimization(
        cal.optimization.values,
        calibration_type=cal.calibration_type,
        max_percentile=cal.max_percentile,
        per_channel=cal.per_channel,
        int16_nodes=int16_nodes,
    )


def job_from_config(cfg, float_model: Optional[onnx.ModelProto] = None) -> ConvertJob:
    """A ConvertJob from a loaded (and model-completed) MapperConfig; ``float_model``: the ONNX
    model it names, when already read (the run then uses it instead of reading the file)."""
    inputs = []
    for ic in cfg.inputs:
        pre = InputPreprocess(
            name=ic.name, input_type_rt=ic.input_type_rt, input_type_train=ic.input_type_train,
            input_layout_train=ic.input_layout_train,
            mean=ic.mean_value if ic.norm_type in ("data_mean", "data_mean_and_scale") else None,
            scale=ic.scale_value if ic.norm_type in ("data_scale", "data_mean_and_scale") else None,
            input_space_and_range=ic.input_space_and_range,
        )
        cal = None
        if ic.cal_data_dir:
            cal = CalInput(name=ic.name, cal_data_dir=ic.cal_data_dir, shape=tuple(ic.input_shape),
                           dtype=ic.calibration_data_type, preprocess_on=cfg.calibration.preprocess_on,
                           input_type_train=ic.input_type_train, input_layout_train=ic.input_layout_train)
        inputs.append(JobInput(pre=pre, shape=tuple(ic.input_shape), input_layout_rt=ic.input_layout_rt or "",
                               input_source=ic.input_source, cal=cal))
    node_info = cfg.model.node_info
    return ConvertJob(
        onnx_model=cfg.model.onnx_model or "",
        float_model=float_model,
        prototxt=cfg.model.prototxt or "",
        caffe_model=cfg.model.caffe_model or "",
        output_model_file_prefix=cfg.model.output_model_file_prefix,
        working_dir=cfg.model.working_dir,
        inputs=inputs,
        quant_options=_quant_options(cfg),
        march=cfg.model.march,
        force_cpu=[n for n, i in node_info.items() if i.on == "CPU"],
        force_bpu=[n for n, i in node_info.items() if i.on == "BPU"],
        softmax_on_bpu=cfg.calibration.optimization.softmax_int8,
        output_nodes=cfg.model.output_nodes,
        input_batch=cfg.input_batch,
        layer_out_dump=cfg.model.layer_out_dump,
        optimize_level=cfg.compiler.optimize_level,
        remove_node_type=cfg.model.remove_node_type,
        remove_node_name=cfg.model.remove_node_name,
        debug_dump_calibration=cfg.model.debug_mode == "dump_calibration_data",
        advice=cfg.compiler.advice or 0,
        build_info=_build_info(cfg),
    )


def check_custom_ops(cfg, model: Optional[onnx.ModelProto] = None) -> None:
    """bpuemu runs standard ONNX operators only: a custom one is an error, a custom_op group a warning.

    A custom CPU operator of the real toolchain is Python code registered from
    op_register_files; a bpuemu `.bin` carries no code for the board to run
    (and a board daemon that ran code out of uploaded models would run anyone's).
    """
    custom = None
    if cfg.model.model_type == "onnx":  # a Caffe net's layers are checked by its converter
        if model is None:
            model = load_onnx(cfg.model.onnx_model, "onnx_model", load_external_data=False)
        custom = next((n for n in model.graph.node if n.domain not in ("", "ai.onnx")), None)
    if custom is not None:
        raise InvalidInput(
            f"node '{custom.name}' (type {custom.op_type}, domain '{custom.domain}') is a custom operator, "
            "and bpuemu runs standard ONNX operators only" + (" (it does not load custom_op op_register_files)"
                                                              if cfg.custom_op else ""),
            hint="replace it with standard ONNX operators; bpuemu places each on the BPU or the CPU")
    if cfg.custom_op:
        keys = [k for k, v in (("custom_op_method", cfg.custom_op.custom_op_method),
                               ("op_register_files", cfg.custom_op.op_register_files),
                               ("custom_op_dir", cfg.custom_op.custom_op_dir)) if v]
        log.warning("custom_op (%s): the model has no custom operator, and bpuemu does not run custom operators; "
                    "the group is ignored", ", ".join(keys))


def makertbin_from_config(config_path: str, model_type: str = "onnx") -> Artifacts:
    from bpuemu.host.config import load_config

    return convert(load_config(config_path, model_type=model_type))


def convert(cfg, float_model: Optional[onnx.ModelProto] = None) -> Artifacts:
    """makertbin on a loaded config: the float model read once (``float_model`` when the caller
    already has it), the config completed from its inputs, custom operators refused, the job run."""
    if float_model is None:
        float_model = read_float_model(cfg)
    cfg = complete_config(cfg, float_inputs(cfg, float_model))
    check_custom_ops(cfg, float_model)
    return run(job_from_config(cfg, float_model))


def makertbin_fast_perf(model_path: str, march: str, input_shapes: Dict[str, Tuple[int, ...]], prototxt: str = "") -> Artifacts:
    """hb_mapper makertbin --fast-perf: the built-in config (``fast_perf_config``) converted."""
    model = None if prototxt else load_onnx(model_path, "onnx_model")
    return convert(fast_perf_config(model_path, march, input_shapes, prototxt=prototxt, model=model), model)


def fast_perf_inputs(model_path: str, input_shapes: Dict[str, Tuple[int, ...]], prototxt: str = "",
                     model: Optional[onnx.ModelProto] = None, shape_option: str = "-i"):
    """--fast-perf's model source (onnx_model, or caffe_model and prototxt) and its inputs' names and
    shapes ("1x3x224x224"): ``input_shapes`` first, a dynamic batch dimension as 1; another dynamic
    dimension is refused, naming the option (``shape_option``) that gives the shape."""
    if prototxt:
        from bpuemu.host.caffe import caffe_inputs

        inputs = caffe_inputs(prototxt)
        source = {"caffe_model": model_path, "prototxt": prototxt}
    else:
        inputs = model_inputs(model if model is not None else model_path)
        source = {"onnx_model": model_path}
    names, shapes = [], []
    for name, shape in inputs:
        if name in input_shapes:
            shape = list(input_shapes[name])
        elif shape and shape[0] is None:
            shape = [1] + shape[1:]
        if any(d is None for d in shape):
            raise InvalidInput(f"input '{name}' has a dynamic shape; give it with {shape_option} {name} 1x3x224x224")
        names.append(name)
        shapes.append("x".join(map(str, shape)))
    return source, names, shapes


def fast_perf_config(model_path: str, march: str, input_shapes: Dict[str, Tuple[int, ...]], working_dir: str = "model_output",
                     prototxt: str = "", model: Optional[onnx.ModelProto] = None):
    """The built-in high-performance config of --fast-perf: featuremap inputs, skip calibration, O3,
    Softmax on the BPU, and the CPU nodes at the model's beginning and end removed (ptq_guide: "Removes
    non-essential CPU operators at the model's beginning and end, including: Quantize/Dequantize,
    Transpose, Cast, Reshape").

    With ``prototxt``, ``model_path`` is a Caffe caffemodel; ``model``: the ONNX model in
    ``model_path`` when already read.
    """
    from bpuemu.host.config import parse_config

    source, names, shapes = fast_perf_inputs(model_path, input_shapes, prototxt, model, shape_option="-i")
    prefix = os.path.splitext(os.path.basename(model_path))[0]
    n = len(names)
    doc = {
        "model_parameters": {**source, "march": march, "output_model_file_prefix": prefix,
                             "working_dir": working_dir, "remove_node_type": ";".join(FAST_PERF_REMOVED_TYPES)},
        "input_parameters": {
            "input_name": ";".join(names), "input_shape": ";".join(shapes),
            "input_type_train": ";".join(["featuremap"] * n), "input_layout_train": ";".join(["NCHW"] * n),
            "input_type_rt": ";".join(["featuremap"] * n), "input_layout_rt": ";".join(["NCHW"] * n),
            "norm_type": ";".join(["no_preprocess"] * n),
        },
        "calibration_parameters": {"calibration_type": "skip", "optimization": "set_Softmax_input_int8"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3"},
    }
    return parse_config(doc, os.getcwd())
