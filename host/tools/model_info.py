"""hb_model_info: the compile-time dependencies and parameters stored in a `.bin`.

The text is the seed's (ptq_guide, "hb_model_info")::

    Start hb_model_info....
    hb_model_info version 1.3.35
    ******** efficient_det_512x512_nv12 info *********
    ############# model deps info #############
    hb_mapper version   : 1.3.35
    ...
    ############# model_parameters info #############     (ConfigInfo.render(): the four parameter groups)
    ...
    --------- input/output types -
    model input types   : [<InputDataType.NV12: 7>]
    model output types  : [<InputDataType.F32: 5>]
    --------- deleted nodes -
    deleted nodes: spconvretinanethead0_conv91_fwd_chw_HzDequantize

Everything comes from the manifest (``Model.build_info`` and the model's
TensorProperties); the parameter groups are rendered by the same code that
defines them for makertbin (bpuemu.host.config.info), so the two never drift.
"""
from typing import Dict, List, Optional, Sequence

from bpuemu.common.container import BinFile
from bpuemu.common.proto import model_pb2
from bpuemu.common.version import __version__

TT = model_pb2.TensorType

#: hb_mapper's InputDataType ordinals, as hb_model_info prints them.
INPUT_DATA_TYPE = {
    "UNDEFINED": 0, "S8": 1, "U8": 2, "S32": 3, "U32": 4, "F32": 5, "Gray": 6, "NV12": 7, "YUV444": 8,
    "BGR": 9, "RGB": 10, "BGRP": 11, "RGBP": 12, "NV12_SEPARATE": 13, "S64": 14, "U64": 15, "F64": 16,
    "S16": 17, "U16": 18, "F16": 19, "S4": 20, "U4": 21,
}

#: TensorProperties.tensor_type -> InputDataType name
_OF_TENSOR_TYPE = {
    TT.HB_DNN_IMG_TYPE_Y: "Gray",
    TT.HB_DNN_IMG_TYPE_NV12: "NV12",
    TT.HB_DNN_IMG_TYPE_NV12_SEPARATE: "NV12_SEPARATE",
    TT.HB_DNN_IMG_TYPE_YUV444: "YUV444",
    TT.HB_DNN_IMG_TYPE_RGB: "RGB",
    TT.HB_DNN_IMG_TYPE_BGR: "BGR",
    TT.HB_DNN_TENSOR_TYPE_S4: "S4",
    TT.HB_DNN_TENSOR_TYPE_U4: "U4",
    TT.HB_DNN_TENSOR_TYPE_S8: "S8",
    TT.HB_DNN_TENSOR_TYPE_U8: "U8",
    TT.HB_DNN_TENSOR_TYPE_F16: "F16",
    TT.HB_DNN_TENSOR_TYPE_S16: "S16",
    TT.HB_DNN_TENSOR_TYPE_U16: "U16",
    TT.HB_DNN_TENSOR_TYPE_F32: "F32",
    TT.HB_DNN_TENSOR_TYPE_S32: "S32",
    TT.HB_DNN_TENSOR_TYPE_U32: "U32",
    TT.HB_DNN_TENSOR_TYPE_F64: "F64",
    TT.HB_DNN_TENSOR_TYPE_S64: "S64",
    TT.HB_DNN_TENSOR_TYPE_U64: "U64",
}

DELETED_NODES_FILE = "deleted_nodes_info.txt"


def input_data_type(tensor_type: int) -> str:
    """``<InputDataType.NV12: 7>`` for a TensorProperties tensor type."""
    name = _OF_TENSOR_TYPE.get(tensor_type, "UNDEFINED")
    return f"<InputDataType.{name}: {INPUT_DATA_TYPE[name]}>"


def _pairs(items) -> tuple:
    return tuple((kv.key, kv.value) for kv in items)


def _line(key: str, value: str) -> str:
    return f"{key:<20}: {value}"


def model_block(model: model_pb2.Model) -> str:
    """The part of the output that describes one model (from the ``*** <name> info ***`` line on)."""
    from bpuemu.host.config.info import ConfigInfo

    info = model.build_info
    groups = ConfigInfo(
        model_parameters=_pairs(info.model_parameters),
        input_parameters=tuple((p.input_name, _pairs(p.params)) for p in info.input_parameters),
        calibration_parameters=_pairs(info.calibration_parameters),
        compiler_parameters=_pairs(info.compiler_parameters),
    )
    lines = [f"******** {model.name} info *********", "############# model deps info #############"]
    lines += [_line(kv.key, kv.value) for kv in info.deps]
    lines.append(groups.render())
    lines += [
        "--------- input/output types -",
        _line("model input types", "[" + ", ".join(input_data_type(p.tensor_type) for p in model.inputs) + "]"),
        _line("model output types", "[" + ", ".join(input_data_type(p.tensor_type) for p in model.outputs) + "]"),
    ]
    if info.deleted_nodes:
        lines.append("--------- deleted nodes -")
        lines += [f"deleted nodes: {name}" for name in info.deleted_nodes]
    return "\n".join(lines)


def select(binfile: BinFile, name: Optional[str] = None) -> List[model_pb2.Model]:
    """The model called ``name``, or every model of the file."""
    return [binfile.model(name)] if name else list(binfile.manifest.models)


def model_info_text(binfile: BinFile, name: Optional[str] = None) -> str:
    """What ``hb_model_info FILE [-m NAME]`` prints."""
    out = ["Start hb_model_info....", f"hb_model_info version {__version__}"]
    out += [model_block(m) for m in select(binfile, name)]
    return "\n".join(out)


def deleted_nodes_info(models: Sequence[model_pb2.Model]) -> List[str]:
    """The lines of deleted_nodes_info.txt: one per deleted node, its initial information."""
    return [line for m in models for line in m.build_info.deleted_nodes_info]


def write_deleted_nodes_info(models: Sequence[model_pb2.Model], path: str = DELETED_NODES_FILE) -> Optional[str]:
    """Write deleted_nodes_info.txt when nodes were removed; returns its path, or None."""
    lines = deleted_nodes_info(models)
    if not lines:
        return None
    from bpuemu.common.atomic import write_file_atomic

    write_file_atomic(path, "\n".join(lines) + "\n")
    return path


def summary(binfile: BinFile) -> Dict[str, object]:
    """A machine-readable form (hb_model_info --json)."""
    out = []
    for m in binfile.manifest.models:
        info = m.build_info
        out.append({
            "name": m.name,
            "deps": dict(_pairs(info.deps)),
            "model_parameters": dict(_pairs(info.model_parameters)),
            "input_parameters": {p.input_name: dict(_pairs(p.params)) for p in info.input_parameters},
            "calibration_parameters": dict(_pairs(info.calibration_parameters)),
            "compiler_parameters": dict(_pairs(info.compiler_parameters)),
            "input_types": [_OF_TENSOR_TYPE.get(p.tensor_type, "UNDEFINED") for p in m.inputs],
            "output_types": [_OF_TENSOR_TYPE.get(p.tensor_type, "UNDEFINED") for p in m.outputs],
            "deleted_nodes": list(info.deleted_nodes),
        })
    return {"file": binfile.source, "packed": binfile.manifest.packed, "models": out}
