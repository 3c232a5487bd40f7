"""The value pass of the yaml layer: check and type each parameter's value.

``validate`` runs a ``schema.Schema`` built from ``tables.GROUPS``: each key's
validator (``_Value``) reads the yaml value by its ``Param.kind`` -- splitting
';'-lists, parsing numbers, shapes and node_info -- and raises ``SchemaError``
with a message that quotes the value and, for a misspelling, the closest
allowed one. schema's own "Missing key(s)" wording is the real hb_mapper's;
``from_schema`` turns its error chain into one ConfigError.
"""
import difflib
import math
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from schema import Optional as OptionalKey
from schema import Schema, SchemaError

from bpuemu.host.config import tables as T
from bpuemu.host.config.errors import ConfigError
from bpuemu.host.config.model import NodeInfo


def kind_of(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: "text", bool: "a boolean"}.get(type(value), f"a {type(value).__name__}")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or ""."""
    choices = [str(c) for c in choices]
    by_lower = {c.lower(): c for c in choices}
    if word.lower() in by_lower:
        return f" (did you mean '{by_lower[word.lower()]}'?)"
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""




def _show(v: Any) -> str:
    return f"'{v}'" if isinstance(v, str) else repr(v)


def _split(data: Any) -> List[Any]:
    """The values of a multi-value key: ``'a; b;c'`` -> ['a', 'b', 'c']; a yaml list or a number as is."""
    if isinstance(data, str):
        return [s.strip() for s in data.split(";") if s.strip()]
    if isinstance(data, (list, tuple)):
        for item in data:
            if isinstance(item, (dict, list)):
                raise SchemaError(f"{_show(item)} should be a single value")
        return [s.strip() if isinstance(s, str) else s for s in data if s is not None and s != ""]
    if isinstance(data, (int, float)):
        return [data]
    raise SchemaError(f"expected a value or values separated by ';', found {kind_of(data)}")


def _text(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise SchemaError(f"{_show(v)} should be text")
    text = str(v).strip()
    if not text:
        raise SchemaError("no value given")
    return text


def _ranges_text(ranges) -> str:
    def one(lo, hi):
        fmt = (lambda x: f"{x:g}") if isinstance(lo, float) or isinstance(hi, float) else str
        return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"

    return " or ".join(one(lo, hi) for lo, hi in ranges)


def _in_ranges(p: T.Param, v):
    if p.choices and v not in p.choices:
        raise SchemaError(f"{v} is not one of {', '.join(map(str, p.choices))}")
    if p.ranges and not any(lo <= v <= hi for lo, hi in p.ranges):
        raise SchemaError(f"{v} is out of range ({_ranges_text(p.ranges)})")
    return v


def _as_bool(p: T.Param, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise SchemaError(f"{_show(v)} is not True or False")


def _as_int(p: T.Param, v: Any) -> int:
    if isinstance(v, str) and re.fullmatch(r"\s*[+-]?\d+\s*", v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise SchemaError(f"{_show(v)} is not an integer")
    return _in_ranges(p, v)


def _as_float(p: T.Param, v: Any) -> float:
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SchemaError(f"{_show(v)} is not a number")
    return _in_ranges(p, float(v))


def _as_enum(p: T.Param, v: Any) -> str:
    text = _text(v)
    if text not in p.choices:
        raise SchemaError(f"'{text}' is not one of {', '.join(p.choices)}{did_you_mean(text, p.choices)}")
    return text


def _as_path(p: T.Param, v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise SchemaError(f"{_show(v)} should be a path")
    return os.path.expanduser(v.strip())


def _as_shape(p: T.Param, v: Any) -> Tuple[int, ...]:
    text = _text(v)
    if not re.fullmatch(r"\d+(?:[xX]\d+)*", text) or any(int(d) == 0 for d in re.split("[xX]", text)):
        raise SchemaError(f"'{text}' is not a shape like 1x3x224x224 (positive integers joined by 'x')")
    return tuple(int(d) for d in re.split("[xX]", text))


def _as_values(p: T.Param, v: Any) -> Tuple[float, ...]:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (float(v),)
    text = _text(v)
    try:
        out = tuple(float(x) for x in re.split(r"[\s,]+", text) if x)
    except ValueError:
        out = ()
    if not out or not all(math.isfinite(x) for x in out):
        raise SchemaError(f"'{text}' is not a list of numbers separated by spaces (or 'None')")
    return out


def _as_node_dtype(p: Optional[T.Param], v: Any) -> Tuple[str, str]:
    text = _text(v)
    name, sep, dtype = text.rpartition(":")
    name, dtype = name.strip(), dtype.strip()
    if not sep or not name:
        raise SchemaError(f"'{text}' should be node_name:{T.NODE_DATA_TYPES[0]}")
    if dtype not in T.NODE_DATA_TYPES:
        raise SchemaError(f"node '{name}': data type '{dtype}' is not one of {', '.join(T.NODE_DATA_TYPES)}"
                          f"{did_you_mean(dtype, T.NODE_DATA_TYPES)}")
    return name, dtype


def _as_optimization(p: T.Param, v: Any) -> str:
    text = _text(v)
    if text in T.OPTIMIZATION_SWITCHES or re.fullmatch(T.OPTIMIZATION_INT16_PATTERN, text):
        return text
    m = re.fullmatch(T.OPTIMIZATION_INT16_PATTERN, text, re.IGNORECASE)
    if m:  # NodeKind is case sensitive: suggest the ONNX spelling's capital
        kind = m.group(1)[:1].upper() + m.group(1)[1:]
        suggestion = f" (did you mean 'set_{kind}_{m.group(2).lower()}_int16'?)"
    else:
        suggestion = did_you_mean(text, T.OPTIMIZATION_SWITCHES)
    raise SchemaError(f"'{text}' is not one of {', '.join(T.OPTIMIZATION_FORMS)}{suggestion}")


def _as_node_info(p: T.Param, v: Any) -> Dict[str, NodeInfo]:
    out: Dict[str, NodeInfo] = {}
    if not isinstance(v, dict):  # 'node1:int16;node2:int16'
        for item in _split(v):
            name, dtype = _as_node_dtype(None, item)
            if name in out:
                raise SchemaError(f"node '{name}' is given twice")
            out[name] = NodeInfo(output_type=dtype)
        return out
    for node, spec in v.items():
        node = str(node)
        if not isinstance(spec, dict) or not spec:
            raise SchemaError(f"node '{node}': {_show(spec)} should be a mapping like "
                              "{'ON': 'BPU', 'InputType': 'int16', 'OutputType': 'int16'}")
        on, input_types, output_type = None, {}, None
        for key, value in spec.items():
            key = "ON" if key is True else str(key)  # yaml 1.1 reads a bare ON as true
            if key == "ON":
                on = _text(value)
                if on not in T.NODE_PLACEMENTS:
                    raise SchemaError(f"node '{node}': ON '{on}' is not one of {', '.join(T.NODE_PLACEMENTS)}"
                                      f"{did_you_mean(on, T.NODE_PLACEMENTS)}")
            elif key == "OutputType":
                output_type = _as_node_dtype(None, f"{node}:{_text(value)}")[1]
            elif re.fullmatch(r"InputType\d*", key):
                index = int(key[len("InputType"):]) if key != "InputType" else "all"
                input_types[index] = _as_node_dtype(None, f"{node}:{_text(value)}")[1]
            elif re.fullmatch(r"OutputType\d+", key):
                raise SchemaError(f"node '{node}': '{key}' is not supported: OutputType applies to every "
                                  "output of the operator (did you mean 'OutputType'?)")
            else:
                raise SchemaError(f"node '{node}': unknown setting '{key}'"
                                  f"{did_you_mean(key, ('ON', 'InputType', 'OutputType'))}; "
                                  "node_info takes ON, InputType, InputType<N> and OutputType")
        out[node] = NodeInfo(on=on, input_types=input_types, output_type=output_type)
    return out


def _as_input_source(p: T.Param, v: Any) -> Dict[str, str]:
    if not isinstance(v, dict):
        raise SchemaError(f"{_show(v)} should be a mapping of input name to source, like {{\"data\": \"ddr\"}}")
    out = {}
    for name, source in v.items():
        source = _text(source)
        if source not in T.INPUT_SOURCES:
            raise SchemaError(f"input '{name}': '{source}' is not one of {', '.join(T.INPUT_SOURCES)}"
                              f"{did_you_mean(source, T.INPUT_SOURCES)}")
        out[str(name)] = source
    return out


_CONVERTERS = {
    "str": lambda p, v: _text(v),
    "path": _as_path,
    "bool": _as_bool,
    "int": _as_int,
    "float": _as_float,
    "enum": _as_enum,
    "shape": _as_shape,
    "values": _as_values,
    "node_dtype": _as_node_dtype,
    "optimization": _as_optimization,
    "node_info": _as_node_info,
    "input_source": _as_input_source,
}


class _Value:
    """A schema validator for one Param: checks the yaml value and returns it typed."""

    def __init__(self, p: T.Param):
        self.p = p
        self.convert = _CONVERTERS[p.kind]

    def validate(self, data: Any, **_kwargs) -> Any:
        p = self.p
        if data is None or (isinstance(data, str) and not data.strip()):
            raise SchemaError("no value given")
        if not p.is_list:
            return self.convert(p, data)
        items = _split(data)
        if not items:
            raise SchemaError("no value given")
        return tuple(None if p.none_ok and item == "None" else self.convert(p, item) for item in items)

    def __repr__(self) -> str:
        return self.p.key


def build_schema(model_type: Optional[str]) -> Schema:
    required_for_type = {"onnx": ("onnx_model",), "caffe": ("caffe_model", "prototxt")}.get(model_type, ())
    groups = {}
    for group, params in T.GROUPS.items():
        body = {
            (p.key if p.required or p.key in required_for_type else OptionalKey(p.key)): _Value(p)
            for p in params
        }
        groups[group if group in T.REQUIRED_GROUPS else OptionalKey(group)] = body
    return Schema(groups)


def validate(doc: Dict[str, Dict[str, Any]], model_type: Optional[str]) -> Dict[str, Dict[str, Any]]:
    try:
        return build_schema(model_type).validate(doc)
    except SchemaError as e:
        raise from_schema(e, model_type) from None


def from_schema(e: SchemaError, model_type: Optional[str]) -> ConfigError:
    """schema's chain ("Key 'g' error:", "Key 'k' error:", detail) as one ConfigError."""
    lines = [a for a in e.autos if a]
    where = []
    while lines and len(where) < 2:
        m = re.fullmatch(r"Key '(.*)' error:", lines[0])
        if not m:
            break
        where.append(m.group(1))
        lines.pop(0)
    detail = "\n".join(dict.fromkeys(lines))  # schema may repeat a line
    group = where[0] if where else None
    key = where[1] if len(where) > 1 else None
    hint = ""
    if key and group and T.param(group, key):
        hint = T.param(group, key).hint
    elif detail.startswith("Missing key") and group is None:
        hint = f"all four parameter groups must be present: {', '.join(T.REQUIRED_GROUPS)}"
    elif detail.startswith("Missing key") and group == "model_parameters" and model_type:
        hint = f"--model-type {model_type} needs " + (
            "onnx_model" if model_type == "onnx" else "caffe_model and prototxt")
    return ConfigError(detail, hint, group=group, key=key)
