"""The hb_mapper makertbin yaml config: load, check, and type it.

    cfg = load_config("mobilenet_config.yaml", model_type="onnx")
    cfg.model.onnx_model, cfg.inputs[0].input_type_rt, cfg.compiler.optimize_level

The keys, allowed values and defaults are data in ``tables``; the checks live
in ``loader``; the result is the frozen dataclasses of ``model``. Every
problem is a ``ConfigError`` worded as the real tool words it.
"""
from bpuemu.host.config.errors import PARSE_FAILED, ConfigError
from bpuemu.host.config.info import ConfigInfo, config_info
from bpuemu.host.config.loader import load_config, parse_config
from bpuemu.host.config.model import (
    CalibrationParameters,
    CompilerParameters,
    CustomOpParameters,
    InputConfig,
    MapperConfig,
    ModelParameters,
    NodeInfo,
    Optimization,
    cal_data_type_from_dir,
)

__all__ = [
    "PARSE_FAILED",
    "CalibrationParameters",
    "CompilerParameters",
    "ConfigError",
    "ConfigInfo",
    "CustomOpParameters",
    "InputConfig",
    "MapperConfig",
    "ModelParameters",
    "NodeInfo",
    "Optimization",
    "cal_data_type_from_dir",
    "config_info",
    "load_config",
    "parse_config",
]
