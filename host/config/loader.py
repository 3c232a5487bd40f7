"""Read, validate and type the hb_mapper makertbin yaml.

Four passes, each raising ConfigError with the seed's wording:

1. read: the file must be YAML (no duplicate keys) holding a mapping;
2. structure: the four groups exist, every key is a known one (did-you-mean
   otherwise), empty optional keys count as not set;
3. values (``values.py``): a ``schema.Schema`` built from ``tables.GROUPS``
   checks each value and converts it (';'-lists split, numbers and shapes
   parsed, node_info normalized) -- its "Missing keys" messages are the real
   tool's;
4. rules between keys: one model source, per-input counts, the
   input_type_train x input_type_rt table, norm_type vs mean/scale, shapes,
   calibration and compiler constraints; then the typed ``MapperConfig``.

Settings that are valid but have no effect (max_percentile without max, ...)
are logged as warnings, not errors.
"""
import logging
import os
import re
from dataclasses import replace
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

import yaml

from bpuemu.host.config import tables as T
from bpuemu.host.config.errors import ConfigError
from bpuemu.host.config.model import (
    CalibrationParameters,
    CompilerParameters,
    CustomOpParameters,
    InputConfig,
    MapperConfig,
    ModelParameters,
    NodeInfo,
    Optimization,
)
from bpuemu.host.config.values import did_you_mean, kind_of, validate

logger = logging.getLogger(__name__)

MODEL_TYPES = ("onnx", "caffe")
_IN, _CAL, _COMP, _MODEL = "input_parameters", "calibration_parameters", "compiler_parameters", "model_parameters"


# --- 1. read ---------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (yaml would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable: SafeLoader reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key '{key}'", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


def load_config(path, model_type: Optional[str] = None, *, check_files: bool = True) -> MapperConfig:
    """Load and check an hb_mapper makertbin yaml file.

    ``model_type`` is ``--model-type`` (onnx or caffe; None: decided by the keys
    present). Relative paths in the file are taken relative to its directory.
    With ``check_files``, onnx_model, cal_data_dir and custom_op files must exist.
    """
    path = os.path.abspath(os.fspath(path))
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"config file '{path}' does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file '{path}': {getattr(e, 'strerror', None) or e}") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise ConfigError(_yaml_reason(e, path)) from None
    return parse_config(raw, os.path.dirname(path), model_type, check_files=check_files, path=path)


def _yaml_reason(e: yaml.YAMLError, path: str) -> str:
    where = ""
    mark = getattr(e, "problem_mark", None)
    if mark is not None:
        where = f" (line {mark.line + 1}, column {mark.column + 1})"
    problem = getattr(e, "problem", None) or str(e)
    return f"'{os.path.basename(path)}' is not valid YAML: {problem}{where}"


def parse_config(
    raw: Any,
    base_dir: str,
    model_type: Optional[str] = None,
    *,
    check_files: bool = True,
    path: str = "",
) -> MapperConfig:
    """Check an already loaded yaml document (a dict) and build the MapperConfig.

    Relative paths are resolved against ``base_dir``.
    """
    if model_type is not None and model_type not in MODEL_TYPES:
        raise ConfigError(f"--model-type '{model_type}' is not one of {', '.join(MODEL_TYPES)}")
    doc = _structure(raw)
    values = validate(doc, model_type)
    return _Builder(values, os.path.abspath(base_dir), model_type, check_files, path).build()


# --- 2. structure --------------------------------------------------------------------------------


def _structure(raw: Any) -> Dict[str, Dict[str, Any]]:
    """The document as {group: {key: value}} with known keys only and unset optional keys left out."""
    if not isinstance(raw, dict):
        what = "is empty" if raw is None else f"holds {kind_of(raw)}"
        raise ConfigError(
            f"the config {what}, not a mapping of parameter groups",
            hint=f"the yaml needs the groups {', '.join(T.REQUIRED_GROUPS)}",
        )
    doc: Dict[str, Dict[str, Any]] = {}
    for group, body in raw.items():
        group = str(group)
        if group not in T.GROUPS:
            owner = T.GROUP_OF_KEY.get(group)
            if owner:
                raise ConfigError(f"'{group}' must be inside the '{owner}' group", hint="check its indentation")
            raise ConfigError(f"unknown parameter group '{group}'{did_you_mean(group, T.GROUPS)}",
                              hint=f"the groups are {', '.join(T.GROUPS)}")
        if body is None:  # every key commented out
            body = {}
        if not isinstance(body, dict):
            raise ConfigError(f"expected a mapping of parameters, found {kind_of(body)}", group=group)
        doc[group] = _group_body(group, body)
    if "custom_op" in doc and not doc["custom_op"]:
        del doc["custom_op"]
    return doc


def _group_body(group: str, body: Dict[Any, Any]) -> Dict[str, Any]:
    known = {p.key: p for p in T.GROUPS[group]}
    out = {}
    for key, value in body.items():
        key = str(key)
        p = known.get(key)
        if p is None:
            raise _unknown_key(group, key, known)
        if not p.required and (value is None or (isinstance(value, str) and not value.strip())):
            continue  # "If it is not set or set to empty, it will not affect the model conversion"
        out[key] = value
    return out


def _unknown_key(group: str, key: str, known: Iterable[str]) -> ConfigError:
    if key in T.GROUPS:
        return ConfigError(f"unknown key '{key}': it is a parameter group", group=group,
                           hint=f"'{key}' must start at the beginning of its line, not inside '{group}'")
    owner = T.GROUP_OF_KEY.get(key)
    if owner:
        return ConfigError(f"unknown key '{key}': it belongs to '{owner}'", group=group,
                           hint=f"move it into '{owner}' (check the indentation)")
    return ConfigError(f"unknown key '{key}'{did_you_mean(key, known)}", group=group)


# --- 3. values: see values.py ---------------------------------------------------------------------


# --- 4. rules between keys, and the typed result --------------------------------------------------


def _missing(*keys: str) -> str:
    """schema's wording for required keys that are absent."""
    return ("Missing key: " if len(keys) == 1 else "Missing keys: ") + ", ".join(f"'{k}'" for k in sorted(keys))


def _values_count(n: int) -> str:
    return f"{n} value" if n == 1 else f"{n} values"


def _shape_text(shape: Optional[Sequence]) -> str:
    return "x".join("?" if d is None or d <= 0 else str(d) for d in shape) if shape is not None else "None"


class _Builder:
    """Applies the rules between keys to the validated groups and builds the MapperConfig."""

    def __init__(self, values, base_dir: str, model_type: Optional[str], check_files: bool, path: str):
        self.mp: Dict[str, Any] = values[_MODEL]
        self.ip: Dict[str, Any] = values[_IN]
        self.cp: Dict[str, Any] = values[_CAL]
        self.comp: Dict[str, Any] = values[_COMP]
        self.co: Optional[Dict[str, Any]] = values.get("custom_op")
        self.base_dir = base_dir
        self.model_type = model_type
        self.check_files = check_files
        self.path = path

    def get(self, group: str, key: str) -> Any:
        """The validated value, or the table's default."""
        body = {_MODEL: self.mp, _IN: self.ip, _CAL: self.cp, _COMP: self.comp, "custom_op": self.co or {}}[group]
        return body[key] if key in body else T.param(group, key).default

    def resolve(self, path: Optional[str]) -> Optional[str]:
        return None if path is None else os.path.normpath(os.path.join(self.base_dir, path))

    def build(self) -> MapperConfig:
        calibration = self.calibration()
        compiler = self.compiler()
        cfg = MapperConfig(
            model=self.model(),
            inputs=self.inputs(calibration, compiler),
            calibration=calibration,
            compiler=compiler,
            custom_op=self.custom_op(),
            path=self.path,
            input_batch=self.get(_IN, "input_batch"),
        )
        for inp in cfg.inputs:
            check_input_shape(inp, cfg)
        return cfg

    # model_parameters
    def model(self) -> ModelParameters:
        onnx_model, caffe_model, prototxt = (self.mp.get(k) for k in ("onnx_model", "caffe_model", "prototxt"))
        if onnx_model and (caffe_model or prototxt):
            raise ConfigError("give either onnx_model or caffe_model + prototxt, not both", group=_MODEL)
        is_caffe = self.model_type == "caffe" or (self.model_type is None and (caffe_model or prototxt))
        if is_caffe:
            missing = [k for k in ("caffe_model", "prototxt") if not self.mp.get(k)]
            if missing:
                raise ConfigError(_missing(*missing), group=_MODEL, hint="--model-type caffe needs caffe_model and prototxt")
            caffe_model, prototxt = self.resolve(caffe_model), self.resolve(prototxt)
            for key, path in (("prototxt", prototxt), ("caffe_model", caffe_model)):
                if self.check_files and not os.path.isfile(path):
                    raise ConfigError(f"file '{path}' does not exist", group=_MODEL, key=key)
        elif not onnx_model:
            raise ConfigError(_missing("onnx_model"), group=_MODEL, hint="set onnx_model to the float ONNX model")
        else:
            onnx_model = self.resolve(onnx_model)
            if self.check_files and not os.path.isfile(onnx_model):
                raise ConfigError(f"file '{onnx_model}' does not exist", group=_MODEL, key="onnx_model")
        prefix = self.mp["output_model_file_prefix"]
        if "/" in prefix or os.sep in prefix:
            raise ConfigError(f"'{prefix}' is a path, not a file name prefix", group=_MODEL,
                              key="output_model_file_prefix", hint="put the directory in working_dir")
        return ModelParameters(
            model_type="caffe" if is_caffe else "onnx",
            onnx_model=None if is_caffe else onnx_model,
            caffe_model=caffe_model if is_caffe else None,
            prototxt=prototxt if is_caffe else None,
            march=self.mp["march"],
            output_model_file_prefix=prefix,
            working_dir=self.resolve(self.get(_MODEL, "working_dir")),
            layer_out_dump=self.get(_MODEL, "layer_out_dump"),
            output_nodes=self.mp.get("output_nodes", ()),
            remove_node_type=self.mp.get("remove_node_type", ()),
            remove_node_name=self.mp.get("remove_node_name", ()),
            debug_mode=self.mp.get("debug_mode"),
            node_info=self.node_info(),
        )

    def node_info(self) -> Dict[str, NodeInfo]:
        """node_info with run_on_cpu, run_on_bpu and set_node_data_type merged in."""
        merged = dict(self.mp.get("node_info", {}))
        placed_by = {name: "node_info" for name, info in merged.items() if info.on}
        for key, on in (("run_on_cpu", "CPU"), ("run_on_bpu", "BPU")):
            for name in self.cp.get(key, ()):
                info = merged.get(name, NodeInfo())
                if info.on and info.on != on:
                    raise ConfigError(
                        f"node '{name}' cannot run on both {info.on} and {on}: "
                        f"{placed_by[name]} puts it on {info.on}, {key} on {on}", group=_CAL, key=key)
                merged[name] = replace(info, on=on)
                placed_by.setdefault(name, key)
        for name, dtype in self.mp.get("set_node_data_type", ()):
            merged[name] = replace(merged.get(name, NodeInfo()), output_type=dtype)
        return merged

    # calibration_parameters
    def calibration(self) -> CalibrationParameters:
        ctype = self.get(_CAL, "calibration_type")
        if "max_percentile" in self.cp and ctype != "max":
            logger.warning("max_percentile is only used by calibration_type max; it is ignored with %s", ctype)
        per_channel = self.get(_CAL, "per_channel")
        if per_channel and ctype == "default":
            logger.warning("per_channel is ignored with calibration_type default, whose search tries per-channel itself")
        return CalibrationParameters(
            calibration_type=ctype,
            max_percentile=self.get(_CAL, "max_percentile"),
            per_channel=per_channel,
            preprocess_on=self.get(_CAL, "preprocess_on"),
            optimization=self.optimization(ctype),
        )

    def optimization(self, ctype: str) -> Optimization:
        values = tuple(dict.fromkeys(self.cp.get("optimization", ())))
        outputs = [v for v in values if v.startswith("set_model_output_")]
        if len(outputs) > 1:
            raise ConfigError(f"{' and '.join(outputs)} cannot both be set", group=_CAL, key="optimization")
        if "asymmetric" in values and ctype == "default":
            raise ConfigError(
                "'asymmetric' cannot be set when calibration_type is default: the default search "
                "decides on asymmetric quantization itself", group=_CAL, key="optimization",
                hint="remove 'asymmetric', or set calibration_type to kl, max or mix")
        if "lstm_batch_last" in values:
            logger.warning("optimization lstm_batch_last: bpuemu has no LSTM operator on the BPU (LSTM runs on "
                           "the CPU with its batch as given); the switch is ignored")
        int16 = [re.fullmatch(T.OPTIMIZATION_INT16_PATTERN, v) for v in values]
        return Optimization(
            values=values,
            model_output_type=outputs[0].rsplit("_", 1)[1] if outputs else None,
            int16_input_kinds=frozenset(m.group(1) for m in int16 if m and m.group(2) == "input"),
            int16_output_kinds=frozenset(m.group(1) for m in int16 if m and m.group(2) == "output"),
            softmax_int8=bool({"set_Softmax_input_int8", "set_Softmax_output_int8"} & set(values)),
            asymmetric="asymmetric" in values,
            bias_correction="bias_correction" in values,
            lstm_batch_last="lstm_batch_last" in values,
        )

    # compiler_parameters
    def compiler(self) -> CompilerParameters:
        mode = self.comp["compile_mode"]
        balance_factor = self.comp.get("balance_factor")
        if mode == "balance" and balance_factor is None:
            raise ConfigError(_missing("balance_factor"), group=_COMP,
                              hint="compile_mode balance needs balance_factor 0-100 "
                                   "(0: as bandwidth, 100: as latency)")
        if mode != "balance" and balance_factor is not None:
            logger.warning("balance_factor is only used by compile_mode balance; it is ignored with %s", mode)
            balance_factor = None
        core_num = self.get(_COMP, "core_num")
        if core_num != T.X5_CORE_NUM:
            raise ConfigError(f"{core_num} is not supported: X5 supports only core_num {T.X5_CORE_NUM}",
                              group=_COMP, key="core_num", hint="X5 (bayes-e) runs a model on one BPU core")
        self.warn_recorded_only()
        return CompilerParameters(
            compile_mode=mode,
            optimize_level=self.comp["optimize_level"],
            balance_factor=balance_factor,
            debug=self.get(_COMP, "debug"),
            core_num=core_num,
            input_source=self.comp.get("input_source", {}),
            max_time_per_fc=self.get(_COMP, "max_time_per_fc"),
            jobs=self.comp.get("jobs"),
            advice=self.comp.get("advice"),
        )

    def warn_recorded_only(self) -> None:
        """Compiler keys that the .bin records (hbdk_pass_through_params) but bpuemu cannot act on."""
        if self.comp.get("max_time_per_fc"):
            logger.warning("max_time_per_fc %s: bpuemu's runtime runs every BPU function-call to completion and "
                           "never preempts a model; the value is only recorded in the .bin", self.comp["max_time_per_fc"])
        if self.comp.get("jobs") is not None:
            logger.warning("jobs %s: bpuemu compiles a model in one process; the value is only recorded in the .bin",
                           self.comp["jobs"])

    # custom_op
    def custom_op(self) -> Optional[CustomOpParameters]:
        if not self.co:
            return None
        op = CustomOpParameters(
            custom_op_method=self.co.get("custom_op_method"),
            op_register_files=self.co.get("op_register_files", ()),
            custom_op_dir=self.resolve(self.co.get("custom_op_dir")),
        )
        if self.check_files:
            for f in op.register_file_paths:
                if not os.path.isfile(os.path.join(self.base_dir, f)):
                    raise ConfigError(f"file '{os.path.join(self.base_dir, f)}' does not exist",
                                      group="custom_op", key="op_register_files")
        return op

    # input_parameters (+ cal_data_dir, cal_data_type, input_source)
    def inputs(self, calibration: CalibrationParameters, compiler: CompilerParameters) -> Tuple[InputConfig, ...]:
        names = self.ip.get("input_name")
        ref_key = "input_name" if names else "input_type_train"
        n = len(names) if names else len(self.ip["input_type_train"])
        if names is None and n > 1:
            raise ConfigError(f"input_name is required when there is more than one input "
                              f"(input_type_train has {n} values)", group=_IN)
        if names and len(set(names)) != len(names):
            dup = next(x for x in names if names.count(x) > 1)
            raise ConfigError(f"'{dup}' is given twice", group=_IN, key="input_name")
        for key in T.PER_INPUT_KEYS:
            group = T.GROUP_OF_KEY[key]
            got = (self.ip if group == _IN else self.cp).get(key)
            if got is not None and len(got) != n:
                raise ConfigError(
                    f"{key} has {_values_count(len(got))} but {ref_key} has {n}", group=group,
                    hint="give one value per input, separated by ';', in the order of input_name")
        if calibration.needs_data and "cal_data_dir" not in self.cp:
            raise ConfigError(_missing("cal_data_dir"), group=_CAL,
                              hint=f"cal_data_dir can only be left out when calibration_type is load or skip "
                                   f"(it is {calibration.calibration_type})")
        sources = compiler.input_source
        if names:
            for key in sources:
                if key not in names:
                    raise ConfigError(f"'{key}' is not an input name (input_name: {', '.join(names)})"
                                      f"{did_you_mean(key, names)}", group=_COMP, key="input_source")
        elif len(sources) > 1:
            raise ConfigError(f"input_source names {len(sources)} inputs but the config describes one",
                              group=_COMP, key="input_source")
        return tuple(self.one_input(i, names[i] if names else None, calibration, sources) for i in range(n))

    def one_input(self, i: int, name: Optional[str], calibration: CalibrationParameters,
                  sources: Dict[str, str]) -> InputConfig:
        def at(group_values, key):
            values = group_values.get(key)
            return values[i] if values is not None else T.param(T.GROUP_OF_KEY[key], key).default

        label = f"input '{name}'" if name else "the input"
        train, rt = self.ip["input_type_train"][i], self.ip["input_type_rt"][i]
        allowed = T.RT_TYPES_FOR_TRAIN[train]
        if rt not in allowed:
            raise ConfigError(
                f"{label}: input_type_rt '{rt}' with input_type_train '{train}' is not supported; "
                f"input_type_train {train} allows input_type_rt {', '.join(allowed)}", group=_IN,
                hint="supported pairs (input_type_train: input_type_rt): "
                     + "; ".join(f"{t}: {'/'.join(r)}" for t, r in T.RT_TYPES_FOR_TRAIN.items()))
        layout_train = self.ip["input_layout_train"][i]
        layout_rt = None if rt in T.LAYOUTLESS_RT_TYPES else (at(self.ip, "input_layout_rt") or layout_train)
        space = at(self.ip, "input_space_and_range")
        if space != "regular" and rt not in T.SPACE_AND_RANGE_RT_TYPES:
            raise ConfigError(f"{label}: {space} only applies to input_type_rt "
                              f"{'/'.join(T.SPACE_AND_RANGE_RT_TYPES)}, not {rt}", group=_IN, key="input_space_and_range")

        norm = self.ip["norm_type"][i]
        mean, scale = at(self.ip, "mean_value"), at(self.ip, "scale_value")
        for key, needed, given in zip(("mean_value", "scale_value"), T.NORM_NEEDS[norm], (mean, scale)):
            if needed and given is None:
                raise ConfigError(f"{label} has norm_type {norm}, which needs {key}"
                                  + (" (it is 'None' for this input)" if key in self.ip else ""),
                                  group=_IN, hint=f"set {key}, one value or one per channel")
            if given is not None and not needed:
                logger.warning("%s: %s is ignored with norm_type %s", label, key, norm)
        if not T.NORM_NEEDS[norm][0]:
            mean = None
        if not T.NORM_NEEDS[norm][1]:
            scale = None

        cal_dir = self.resolve(at(self.cp, "cal_data_dir"))
        if cal_dir and calibration.needs_data and self.check_files and not os.path.isdir(cal_dir):
            raise ConfigError(f"directory '{cal_dir}' of {label} does not exist", group=_CAL, key="cal_data_dir")

        source = sources.get(name) if name else next(iter(sources.values()), None)
        source = source or T.DEFAULT_INPUT_SOURCE.get(rt, T.FALLBACK_INPUT_SOURCE)
        if source in T.CAMERA_SOURCES and rt not in T.CAMERA_SOURCE_RT_TYPES:
            raise ConfigError(f"{label}: {source} delivers {'/'.join(T.CAMERA_SOURCE_RT_TYPES)} data only, "
                              f"but input_type_rt is {rt}", group=_COMP, key="input_source",
                              hint="use ddr for rgb, bgr, yuv444 and featuremap inputs")
        return InputConfig(
            name=name,
            input_type_train=train,
            input_layout_train=layout_train,
            input_type_rt=rt,
            input_layout_rt=layout_rt,
            input_space_and_range=space,
            input_shape=at(self.ip, "input_shape"),
            norm_type=norm,
            mean_value=mean,
            scale_value=scale,
            cal_data_dir=cal_dir,
            cal_data_type=at(self.cp, "cal_data_type"),
            input_source=source,
        )


def check_input_shape(inp: InputConfig, cfg: MapperConfig) -> None:
    """The rules that need the input's shape; nothing to check while it is None."""
    shape = inp.input_shape
    if shape is None:
        return
    label, text = inp.label, _shape_text(shape)
    if inp.input_type_train != "featuremap":
        if len(shape) != 4:
            raise ConfigError(f"{label}: input_shape {text} is not 4-dimensional, as an image input "
                              f"(input_type_train {inp.input_type_train}) must be", group=_IN, key="input_shape")
        want = T.CHANNELS_OF_TRAIN_TYPE[inp.input_type_train]
        if inp.channels != want:
            raise ConfigError(
                f"{label}: input_shape {text} has {inp.channels} channels in input_layout_train "
                f"{inp.input_layout_train}, but input_type_train {inp.input_type_train} has {want}",
                group=_IN, hint="input_layout_train must be the layout of the float model's input")
        h, w = inp.height_width
        if inp.input_type_rt in T.EVEN_SIZE_RT_TYPES and (h % 2 or w % 2):
            raise ConfigError(
                f"{label}: input_type_rt {inp.input_type_rt} needs an even height and width, "
                f"but input_shape {text} has H={h}, W={w}", group=_IN,
                hint="odd sizes cannot appear in the input of an nv12 or yuv444 model")
    for key, values in (("mean_value", inp.mean_value), ("scale_value", inp.scale_value)):
        if values is not None and len(values) != 1 and len(values) != inp.channels:
            per_channel = f"one per channel ({inp.channels})" if inp.channels else "one per channel"
            raise ConfigError(f"{label} has {_values_count(len(values))}, but takes 1 or {per_channel}",
                              group=_IN, key=key)
    if cfg.input_batch > 1 and shape[0] != 1:
        raise ConfigError(
            f"input_batch {cfg.input_batch} can only be used when the first dimension of input_shape is 1, "
            f"but {label} has {text}", group=_IN, key="input_batch",
            hint="a model whose input_shape starts with N > 1 is already a batch-N model")
    if cfg.calibration.preprocess_on and len(shape) != 4:
        raise ConfigError(f"preprocess_on only works with 4-dimensional image inputs; {label} is {text}",
                          group=_CAL, key="preprocess_on")
    if inp.input_source == "resizer" and inp.height_width:
        h, w = inp.height_width
        if h * w >= T.RESIZER_MAX_HW:
            raise ConfigError(f"{label}: resizer needs H*W below {T.RESIZER_MAX_HW}, but {h}x{w} is {h * w}",
                              group=_COMP, key="input_source")


def complete_config(cfg: MapperConfig, model_inputs: Sequence[Tuple[str, Optional[Sequence[Optional[int]]]]]) -> MapperConfig:
    """This config with names and shapes taken from the model where the yaml left them out.

    ``model_inputs`` lists the float model's inputs in order as (name, shape),
    a dimension being None or <= 0 where it is dynamic. The checks that need a
    shape (odd nv12 sizes, mean/scale counts, input_batch, ...) run again.
    Raises ConfigError when the config does not fit the model.
    """
    model_inputs = [(str(n), None if s is None else tuple(s)) for n, s in model_inputs]
    model_names = [n for n, _ in model_inputs]
    shapes = dict(model_inputs)
    if len(cfg.inputs) == 1 and cfg.inputs[0].name is None:
        if len(model_inputs) != 1:
            raise ConfigError(f"input_name is required: the model has {len(model_inputs)} inputs "
                              f"({', '.join(model_names)})", group=_IN)
        name = model_names[0]
        for key in cfg.compiler.input_source:
            if key != name:
                raise ConfigError(f"'{key}' is not an input of the model (its input is '{name}')",
                                  group=_COMP, key="input_source")
        named = [replace(cfg.inputs[0], name=name)]
    else:
        for inp in cfg.inputs:
            if inp.name not in shapes:
                raise ConfigError(f"'{inp.name}' is not an input of the model{did_you_mean(inp.name, model_names)}; "
                                  f"its inputs are {', '.join(model_names)}", group=_IN, key="input_name")
        missing = [n for n in model_names if n not in cfg.input_names]
        if missing:
            raise ConfigError(f"the model input(s) {', '.join(missing)} are not configured", group=_IN, key="input_name",
                              hint="every model input needs its entry in input_name and the other per-input parameters")
        named = list(cfg.inputs)
    completed = []
    for inp in named:
        model_shape = shapes[inp.name]
        dynamic = model_shape is None or any(d is None or d <= 0 for d in model_shape)
        if inp.input_shape is None:
            if dynamic:
                raise ConfigError(f"input '{inp.name}' has the dynamic shape {_shape_text(model_shape)}",
                                  group=_IN, key="input_shape", hint="set input_shape for this input")
            inp = replace(inp, input_shape=tuple(int(d) for d in model_shape))
        elif model_shape is not None and (
            len(model_shape) != len(inp.input_shape)
            or any(d is not None and d > 0 and d != c for d, c in zip(model_shape, inp.input_shape))
        ):
            raise ConfigError(f"input '{inp.name}': input_shape {_shape_text(inp.input_shape)} does not fit "
                              f"the model's {_shape_text(model_shape)}", group=_IN, key="input_shape")
        completed.append(inp)
    out = replace(cfg, inputs=tuple(completed))
    for inp in out.inputs:
        check_input_shape(inp, out)
    return out
