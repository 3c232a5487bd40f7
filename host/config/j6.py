"""The hb_compile yaml (the J6 flow): the X5 yaml's four groups as the J6 documents them.

    cfg = load_compile_config("config.yaml")
    cfg.config          # a MapperConfig (bpuemu.host.config.model), march nash-*
    cfg.quant_config    # calibration_parameters.quant_config as given: a JSON file (absolute path),
                        # an inline mapping, or None; bpuemu.host.quant.quant_config reads it
    cfg.debug_mode      # "dump_all_layers_output", "dump_calibration_data" or None

What differs from the X5 yaml (ptq_faq_j6), checked here before the X5
loader checks the rest:

* ``march`` is a J6 march (``nash-e/m/b/h/p``); ``bayes-e`` is hb_mapper's.
* ``optimize_level`` is one of the march's levels (O0-O2).
* The ONNX layout is kept: ``input_layout_train`` / ``input_layout_rt`` are
  refused with the FAQ's answer, and each image input's layout is read from
  the model (the dimension holding the input type's channels).
* Precision and placement come from ``quant_config``: ``node_info``,
  ``run_on_cpu``, ``run_on_bpu`` and ``set_node_data_type`` are refused.
* ``debug_mode`` also takes ``dump_all_layers_output``, which replaces
  ``layer_out_dump``.
* ``std_value`` (input_parameters) may stand for ``scale_value``: the data is
  divided by it (scale = 1 / std), per input and per channel.
* The calibration method is quant_config's: ``model_config.activation.calibration_type``
  wins over ``calibration_parameters.calibration_type`` (legacy on J6), which is
  used only when the quant_config does not set one (``calibration_rule``). The
  winner is what every check of the yaml reads (cal_data_dir, max_percentile),
  and ``CompileConfig.calibration_line`` says, in one log line, which it was.

Each refusal is one line naming the key and the answer.
"""
import json
import os
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Union

import yaml

from bpuemu.common.errors import InvalidInput
from bpuemu.common.march import J6_MARCHES, MARCHES
from bpuemu.host.config import tables as T
from bpuemu.host.config.errors import ConfigError
from bpuemu.host.config.loader import _UniqueKeyLoader, _yaml_reason, parse_config
from bpuemu.host.config.model import MapperConfig

_MODEL, _IN, _CAL, _COMP = "model_parameters", "input_parameters", "calibration_parameters", "compiler_parameters"

_LAYOUT_ANSWER = ("the J6 flow keeps the ONNX model's layout (ptq_faq_j6: \"ONNX model layout will keep unchanged "
                  "during the conversion process\"); change the layout in the model before exporting it, e.g. a "
                  "Transpose at its input")
_PRECISION_ANSWER = "the J6 flow sets precision and placement with calibration_parameters.quant_config"
#: key -> why the J6 flow does not have it (the answer the refusal gives).
X5_ONLY_KEYS: Dict[str, str] = {
    "input_layout_train": _LAYOUT_ANSWER,
    "input_layout_rt": _LAYOUT_ANSWER,
    "node_info": _PRECISION_ANSWER,
    "run_on_cpu": _PRECISION_ANSWER,
    "run_on_bpu": _PRECISION_ANSWER,
    "set_node_data_type": _PRECISION_ANSWER,
    "layer_out_dump": "the J6 flow dumps layer outputs with model_parameters.debug_mode: dump_all_layers_output",
}
DEBUG_MODES = ("dump_all_layers_output", "dump_calibration_data")

QuantConfig = Union[None, str, dict]


@dataclass(frozen=True)
class CompileConfig:
    config: MapperConfig
    quant_config: QuantConfig = None
    debug_mode: Optional[str] = None
    #: The calibration method in effect and where it came from (calibration_rule), one log line.
    calibration_line: str = ""

    @property
    def dump_all_layers_output(self) -> bool:
        return self.debug_mode == "dump_all_layers_output"


def load_compile_config(path, *, check_files: bool = True) -> CompileConfig:
    """Load and check an hb_compile yaml file; relative paths are taken from its directory."""
    path = os.path.abspath(os.fspath(path))
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.load(f.read(), Loader=_UniqueKeyLoader)
    except FileNotFoundError:
        raise ConfigError(f"config file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file '{path}': {getattr(e, 'strerror', None) or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(_yaml_reason(e, path)) from None
    return parse_compile_config(raw, os.path.dirname(path), check_files=check_files, path=path)


def parse_compile_config(raw: Any, base_dir: str, *, check_files: bool = True, path: str = "",
                         model_inputs: Optional[List] = None) -> CompileConfig:
    """Check an hb_compile yaml document (a dict); ``model_inputs``: the float model's (name, shape)
    when the caller has them (else read from onnx_model)."""
    if not isinstance(raw, dict):
        raise ConfigError("the config is not a mapping of parameter groups",
                          hint=f"the yaml needs the groups {', '.join(T.REQUIRED_GROUPS)}")
    doc = {g: dict(b) if isinstance(b, dict) else b for g, b in raw.items()}
    _refuse_x5_keys(doc)
    mp = doc.get(_MODEL) if isinstance(doc.get(_MODEL), dict) else {}
    march = _j6_march(mp.get("march"))
    level = (doc.get(_COMP) or {}).get("optimize_level") if isinstance(doc.get(_COMP), dict) else None
    if level is not None and str(level) not in MARCHES[march].optimize_levels:
        raise InvalidInput(f"optimize_level {level} (compiler_parameters) is not supported on {march}: "
                           f"the J6 compiler's levels are {', '.join(MARCHES[march].optimize_levels)}")
    debug_mode = mp.pop("debug_mode", None) or None
    if debug_mode is not None and debug_mode not in DEBUG_MODES:
        raise InvalidInput(f"debug_mode '{debug_mode}' (model_parameters) is not one of {', '.join(DEBUG_MODES)}")
    if debug_mode == "dump_calibration_data":
        mp["debug_mode"] = debug_mode
    cal = doc.get(_CAL) if isinstance(doc.get(_CAL), dict) else {}
    quant_config = _quant_config(cal.pop("quant_config", None), base_dir, check_files)
    calibration_line = calibration_rule(cal, quant_config)
    _std_as_scale(doc.get(_IN))
    mp["march"] = "bayes-e"  # the X5 tables check the rest; the J6 march was checked above
    _kept_layouts(doc, base_dir, model_inputs)
    cfg = parse_config(doc, base_dir, check_files=check_files, path=path)
    cfg = replace(cfg, model=replace(cfg.model, march=march))
    return CompileConfig(cfg, quant_config, debug_mode, calibration_line)


def _refuse_x5_keys(doc: Dict[str, Any]) -> None:
    for group, body in doc.items():
        if not isinstance(body, dict):
            continue
        for key in body:
            if key in X5_ONLY_KEYS and body[key] not in (None, ""):
                raise InvalidInput(f"{key} ({group}) is not a J6 key: {X5_ONLY_KEYS[key]}")


def _std_as_scale(ip: Any) -> None:
    """std_value -> scale_value (1 / std), per input (';') and per channel (' ')."""
    if not isinstance(ip, dict):
        return
    std = ip.pop("std_value", None)
    if std in (None, ""):
        return
    if ip.get("scale_value") not in (None, ""):
        raise InvalidInput("std_value and scale_value (input_parameters) are both given: give one "
                           "(scale_value = 1 / std_value)")
    per_input = []
    for entry in str(std).split(";"):
        entry = entry.strip()
        if entry in ("", "None"):
            per_input.append("None")
            continue
        try:
            values = [float(v) for v in entry.split()]
        except ValueError:
            raise InvalidInput(f"std_value (input_parameters) '{entry}' is not a list of numbers") from None
        if any(v == 0 for v in values):
            raise InvalidInput(f"std_value (input_parameters) '{entry}' holds a 0: the data is divided by it")
        per_input.append(" ".join(repr(1.0 / v) for v in values))
    ip["scale_value"] = ";".join(per_input)


def _j6_march(name: Any) -> str:
    if name is None or str(name).strip() == "":
        raise InvalidInput("march (model_parameters) is required: one of " + ", ".join(J6_MARCHES))
    name = str(name).strip().lower()
    if name not in J6_MARCHES:
        also = "; bayes-e (X5) converts with hb_mapper makertbin" if name in MARCHES else ""
        raise InvalidInput(f"march '{name}' is not a J6 march: hb_compile converts for {', '.join(J6_MARCHES)}{also}")
    return name


def _quant_config(value: Any, base_dir: str, check_files: bool) -> QuantConfig:
    """quant_config as given: a JSON file (resolved against the yaml's directory) or an inline mapping."""
    if value is None or value == "":
        return None
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        path = os.path.normpath(os.path.join(base_dir, value))
        if check_files and not os.path.isfile(path):
            raise InvalidInput(f"quant_config (calibration_parameters): file '{path}' does not exist")
        return path
    raise InvalidInput(f"quant_config (calibration_parameters) must be a JSON file's path or a mapping, "
                       f"not {type(value).__name__}")


_QC_CALIBRATION = "quant_config model_config.activation.calibration_type"
_YAML_CALIBRATION = "calibration_parameters.calibration_type"


def calibration_rule(cal: Dict[str, Any], quant_config: QuantConfig) -> str:
    """The run's one calibration method: the quant_config's model-level calibration_type when it sets
    one, else the yaml's (legacy on J6), else default. Writes the winner into ``cal`` (the yaml's
    calibration_parameters) and returns the log line saying which it is and where it came from."""
    from_qc = _quant_config_calibration(quant_config)
    from_yaml = cal.get("calibration_type")
    from_yaml = None if from_yaml in (None, "") else str(from_yaml)
    if from_qc is not None:
        cal["calibration_type"] = from_qc
        if from_yaml is not None and from_yaml != from_qc:
            return (f"calibration_type {from_qc}: from {_QC_CALIBRATION}, which wins; {_YAML_CALIBRATION} "
                    f"{from_yaml} is legacy on J6 and is not used")
        return f"calibration_type {from_qc}: from {_QC_CALIBRATION}"
    if from_yaml is not None:
        return (f"calibration_type {from_yaml}: from {_YAML_CALIBRATION} (legacy on J6; {_QC_CALIBRATION} "
                "wins when set)")
    return f"calibration_type default: neither {_QC_CALIBRATION} nor {_YAML_CALIBRATION} is set"


def _quant_config_calibration(quant_config: QuantConfig) -> Optional[str]:
    """model_config.activation.calibration_type of a quant_config when it is one of the calibration types;
    None otherwise (a quant_config that cannot be read or holds a bad value is refused with its own
    message when the conversion parses it, bpuemu.host.quant.quant_config)."""
    data = quant_config
    if isinstance(quant_config, str):
        try:
            with open(quant_config, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError):
            return None
    try:
        value = data["model_config"]["activation"]["calibration_type"]
    except (KeyError, TypeError):
        return None
    return value if value in T.CALIBRATION_TYPES else None


def kept_layout(shape, input_type_train: str) -> str:
    """The layout an image input has in the model: NHWC when only the last dimension holds its channels."""
    channels = T.CHANNELS_OF_TRAIN_TYPE.get(input_type_train)
    if channels is None or shape is None or len(shape) != 4:
        return "NCHW"
    return "NHWC" if shape[3] == channels and shape[1] != channels else "NCHW"


def _kept_layouts(doc: Dict[str, Any], base_dir: str, model_inputs: Optional[List]) -> None:
    """input_layout_train per input: the model's own layout (no input_layout_rt: it is the same)."""
    ip = doc.get(_IN)
    if not isinstance(ip, dict) or "input_type_train" not in ip:
        return  # the X5 loader reports the missing key
    trains = [t.strip() for t in str(ip["input_type_train"]).split(";") if t.strip()]
    names = [n.strip() for n in str(ip.get("input_name") or "").split(";") if n.strip()]
    given = [s.strip() for s in str(ip.get("input_shape") or "").split(";") if s.strip()]
    shapes = dict(model_inputs) if model_inputs is not None else _model_shapes(doc, base_dir)
    layouts = []
    for i, train in enumerate(trains):
        shape = None
        if i < len(given) and given[i] != "None":
            try:
                shape = [int(d) for d in given[i].lower().split("x")]
            except ValueError:
                shape = None  # the X5 loader reports it
        elif names and i < len(names):
            shape = shapes.get(names[i])
        elif len(shapes) == 1:
            shape = next(iter(shapes.values()))
        layouts.append(kept_layout(shape, train))
    ip["input_layout_train"] = ";".join(layouts)


def _model_shapes(doc: Dict[str, Any], base_dir: str) -> Dict[str, Any]:
    mp = doc.get(_MODEL) or {}
    onnx_model = mp.get("onnx_model")
    if not onnx_model:
        return {}
    path = os.path.normpath(os.path.join(base_dir, str(onnx_model)))
    if not os.path.isfile(path):
        return {}  # the X5 loader reports it
    from bpuemu.host.onnxgraph import graph_inputs, load_onnx

    m = load_onnx(path, "onnx_model", load_external_data=False)
    return {i.name: [d.dim_value if d.dim_value > 0 else None for d in i.type.tensor_type.shape.dim]
            for i in graph_inputs(m)}
