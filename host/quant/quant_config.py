"""``quant_config``: the J6 flow's precision configuration (a JSON file, or the same mapping inline).

The shape follows the J6 toolchain's quant_config, three levels of which the
most specific wins (node beats op type beats model)::

    {
      "model_config": {"all_node_type": "int16",
                       "activation": {"calibration_type": "max", "max_percentile": 0.99995,
                                      "per_channel": false, "asymmetric": false}},
      "op_config":    {"Conv": {"qtype": "int8"},
                       "Softmax": {"qtype": "float32"}},
      "node_config":  {"conv_1": {"qtype": "int16", "activation": {"calibration_type": "kl"}},
                       "concat_out": {"unitconv": "after"}}
    }

* ``qtype``: int8, int16, float16 or float32, where the march's ``config_qtypes``
  allow. A qtype the march's BPU computes in (``bpu_qtypes``) keeps the node on
  the BPU at that type; another one (float32 anywhere, float16 on nash-e/m)
  runs the node on the CPU in float. A node's qtype is the type of its output.
* ``activation.calibration_type``: at model level one of the calibration types
  (default, mix, kl, max, skip, load); per op type or node, kl or max (with
  ``max_percentile``), which recalibrates the scale group of that node's output.
* ``model_config.activation`` may also give ``max_percentile``, ``per_channel``
  and ``asymmetric``, as the yaml's calibration_parameters do.

What is bpuemu's own: ``node_config.<node>.unitconv`` ("after" or "before")
inserts a 1x1 identity Conv named ``<node>_unitconv`` after the node's output
(or before its first input) so that a passive operator at the model's head or
tail gets a threshold of its own and runs on the BPU (ptq_faq_j6, "How to use
unitconv operator"); the real toolchain leaves inserting it to the user's model.
The J6 keys bpuemu does not model (``weight``, ``modelwise_search``,
``layerwise_search``, ``subgraph_config``, per-input types) are refused with
one line naming the key, as any unknown key is.

Names the model does not have: a ``node_config`` name that is not a node of the
float model is an error (a misspelt node would otherwise be a silent no-op); an
``op_config`` op type the model does not contain is a WARNING, because the
documents' platform templates list op types (Resize, GridSample) for any model.
"""
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

from schema import And, Optional as OptionalKey, Or, Schema, SchemaError

from bpuemu.common.errors import InvalidInput
from bpuemu.common.march import March

QTYPES = ("int8", "int16", "float16", "float32")
#: calibration_type at model level (the yaml's values); per op type / node only the per-group methods.
MODEL_CALIBRATION_TYPES = ("default", "mix", "kl", "max", "skip", "load")
NODE_CALIBRATION_TYPES = ("kl", "max")
UNITCONV_SIDES = ("after", "before")

#: Where a resolved value came from (what the log and the node table say).
MODEL, OP, NODE = "model_config", "op_config", "node_config"

QuantConfigValue = Union[None, str, Mapping[str, Any]]


@dataclass(frozen=True)
class LevelConfig:
    """What one level (the model, an op type, a node) configures."""

    qtype: Optional[str] = None
    calibration_type: Optional[str] = None
    max_percentile: Optional[float] = None
    per_channel: Optional[bool] = None         # model level only
    asymmetric: Optional[bool] = None          # model level only
    unitconv: Optional[str] = None             # node level only (bpuemu's own)


@dataclass(frozen=True)
class Resolved:
    """A node's configured qtype / calibration method and the level each came from."""

    qtype: Optional[str] = None
    qtype_from: str = ""          # "node_config", "op_config", "model_config" or ""
    calibration_type: Optional[str] = None
    max_percentile: Optional[float] = None

    def describe(self) -> str:
        """``quant_config node_config qtype int16``: where the qtype was configured."""
        return f"quant_config {self.qtype_from} qtype {self.qtype}"


@dataclass(frozen=True)
class QuantConfig:
    """A parsed quant_config; ``source`` names it in messages (its path, or "inline")."""

    model: LevelConfig = LevelConfig()
    ops: Mapping[str, LevelConfig] = field(default_factory=dict)
    nodes: Mapping[str, LevelConfig] = field(default_factory=dict)
    source: str = "quant_config"

    def resolve(self, node: str, op_type: str) -> Resolved:
        """The node's qtype and calibration method: node beats op type beats model."""
        levels = [(NODE, self.nodes.get(node)), (OP, self.ops.get(op_type)), (MODEL, self.model)]
        qtype, qfrom = next(((lv.qtype, where) for where, lv in levels if lv is not None and lv.qtype), (None, ""))
        # The model-level calibration_type is the whole run's strategy (QuantOptions), not a per-node override.
        cal = next((lv for _, lv in levels[:2] if lv is not None and lv.calibration_type), None)
        return Resolved(qtype, qfrom, cal.calibration_type if cal else None, cal.max_percentile if cal else None)

    def unitconvs(self) -> Dict[str, str]:
        """Node -> "after" / "before": where bpuemu inserts a unitconv (bpuemu's own key)."""
        return {n: lv.unitconv for n, lv in self.nodes.items() if lv.unitconv}

    def check_names(self, float_nodes: Mapping[str, str], log: logging.Logger) -> None:
        """Refuse node_config names the float model (node name -> op type) does not have; warn for op types."""
        missing = [n for n in self.nodes if n not in float_nodes]
        if missing:
            from bpuemu.host.config.values import did_you_mean

            raise InvalidInput(f"{self.source}: node_config names '{missing[0]}', which is not a node of the model"
                               + did_you_mean(missing[0], float_nodes))
        present = set(float_nodes.values())
        for op in self.ops:
            if op not in present:
                log.warning("%s: op_config names op type '%s', which the model does not contain; it configures nothing",
                            self.source, op)


# --- parsing -----------------------------------------------------------------------------------

class _OneOf:
    """A schema validator: one of ``choices``; its error quotes the value."""

    def __init__(self, choices: Tuple[str, ...], what: str):
        self.choices, self.what = choices, what

    def validate(self, value: Any) -> Any:
        if not isinstance(value, str) or value not in self.choices:
            raise SchemaError(f"{self.what} {value!r} is not one of {', '.join(self.choices)}")
        return value


def _one_of(choices: Tuple[str, ...], what: str) -> _OneOf:
    return _OneOf(choices, what)


_BOOL = Or(bool, error="should be true or false")
_PERCENTILE = And(Or(int, float), lambda v: not isinstance(v, bool) and 0.5 <= v <= 1.0,
                  error="max_percentile should be a number in 0.5~1.0")


def _activation(level_calibrations: Tuple[str, ...], model_level: bool) -> Schema:
    keys = {OptionalKey("calibration_type"): _one_of(level_calibrations, "calibration_type"),
            OptionalKey("max_percentile"): _PERCENTILE}
    if model_level:
        keys.update({OptionalKey("per_channel"): _BOOL, OptionalKey("asymmetric"): _BOOL})
    return keys


def _level_keys(march: March, where: str) -> Dict[Any, Any]:
    qtypes = tuple(q for q in QTYPES if q in march.config_qtypes)
    keys: Dict[Any, Any] = {
        OptionalKey("all_node_type" if where == MODEL else "qtype"): _one_of(qtypes, f"qtype on {march.name}:"),
        OptionalKey("activation"): _activation(MODEL_CALIBRATION_TYPES if where == MODEL else NODE_CALIBRATION_TYPES,
                                               where == MODEL),
    }
    if where == NODE:
        keys[OptionalKey("unitconv")] = _one_of(UNITCONV_SIDES, "unitconv")
    return keys


def _known_keys(spec: Mapping[Any, Any]) -> Tuple[str, ...]:
    return tuple(k.schema if isinstance(k, OptionalKey) else k for k in spec)


def _check_keys(value: Any, spec: Mapping[Any, Any], path: str, source: str) -> None:
    """Unknown keys first, one line naming the key (schema's own message quotes the whole mapping)."""
    if not isinstance(value, dict):
        raise InvalidInput(f"{source}: {path} should be a mapping (JSON object), found {type(value).__name__}")
    known = _known_keys(spec)
    for key in value:
        if key not in known:
            from bpuemu.host.config.values import did_you_mean

            raise InvalidInput(f"{source}: unknown key '{key}' in {path}" + did_you_mean(str(key), known),
                               hint=f"bpuemu's quant_config keys here: {', '.join(known)}")
    for key, sub in spec.items():
        name = key.schema if isinstance(key, OptionalKey) else key
        if isinstance(sub, dict) and name in value:
            _check_keys(value[name], sub, f"{path}.{name}", source)


def _level(value: Mapping[str, Any], march: March, where: str, path: str, source: str) -> LevelConfig:
    spec = _level_keys(march, where)
    _check_keys(value, spec, path, source)
    try:
        Schema(spec).validate(value)
    except SchemaError as exc:
        detail = [a for a in exc.autos + exc.errors if a][-1]
        raise InvalidInput(f"{source}: {path}: {detail}") from None
    act = value.get("activation", {})
    return LevelConfig(qtype=value.get("all_node_type" if where == MODEL else "qtype"),
                       calibration_type=act.get("calibration_type"), max_percentile=act.get("max_percentile"),
                       per_channel=act.get("per_channel"), asymmetric=act.get("asymmetric"),
                       unitconv=value.get("unitconv"))


def _read(value: QuantConfigValue) -> Tuple[Mapping[str, Any], str]:
    """The mapping and the name messages give it: a JSON file's path or "quant_config (inline)"."""
    if isinstance(value, Mapping):
        return value, "quant_config (inline)"
    if not isinstance(value, str):
        raise InvalidInput(f"quant_config should be a JSON file's path or a mapping, found {type(value).__name__}")
    path = value
    name = f"quant_config {path}"
    if not os.path.isfile(path):
        raise InvalidInput(f"{name}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), name
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{name}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{name}: cannot be read: {exc}") from None


def parse_quant_config(value: QuantConfigValue, march: March) -> Optional[QuantConfig]:
    """The parsed quant_config (None when none is given); one InvalidInput line for anything wrong."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    data, source = _read(value)
    _check_keys(data, {OptionalKey(MODEL): None, OptionalKey(OP): None, OptionalKey(NODE): None}, "the top level", source)
    model = _level(data.get(MODEL) or {}, march, MODEL, MODEL, source)

    def named(group: str) -> Dict[str, LevelConfig]:
        entries = data.get(group, {})
        if entries is None:
            entries = {}
        if not isinstance(entries, dict):
            raise InvalidInput(f"{source}: {group} should be a mapping of names to settings")
        return {str(k): _level(v, march, group, f"{group}.{k}", source) for k, v in entries.items()}

    return QuantConfig(model, named(OP), named(NODE), source)


def configured_nodes(config: QuantConfig, nodes: Iterable[Tuple[str, str]]) -> Dict[str, Resolved]:
    """Node -> its resolution, for the nodes (name, op type) some level configures."""
    out = {}
    for name, op in nodes:
        r = config.resolve(name, op)
        if r.qtype or r.calibration_type:
            out[name] = r
    return out


def placement_qtypes(resolved: Mapping[str, Resolved]) -> Dict[str, Tuple[str, str]]:
    """What placement reads: node -> (qtype, the level that configured it)."""
    return {n: (r.qtype, r.qtype_from) for n, r in resolved.items() if r.qtype}


def quant_options(config: Optional[QuantConfig], options, resolved: Mapping[str, Resolved], placement,
                  node_outputs: Mapping[str, Tuple[str, ...]]):
    """``options`` (QuantOptions) with what the quant_config and the placement add: the model-level
    calibration settings, int16 outputs of the BPU nodes configured int16 (passive ops take their
    neighbours' type instead), per-node calibration methods, and the tail Conv's unquantized output."""
    from bpuemu.host.compiler.optable import BPU_OPS
    from bpuemu.host.quant.options import Int16Spec

    changes: Dict[str, Any] = {}
    if config is not None:
        m = config.model
        for key, value in (("calibration_type", m.calibration_type), ("max_percentile", m.max_percentile),
                           ("per_channel", m.per_channel), ("asymmetric", m.asymmetric)):
            if value is not None:
                changes[key] = value
        placed = placement.by_name()
        int16 = dict(options.int16_nodes)
        for name, r in resolved.items():
            p = placed.get(name)
            # float16 on a BPU that has it (nash-b/h/p) is emulated with int16 (bpuemu has no float16 kernels)
            if r.qtype in ("int16", "float16") and p is not None and p.on == "BPU" and BPU_OPS[p.op_type].active:
                int16[name] = int16[name].merged(Int16Spec(output=True)) if name in int16 else Int16Spec(output=True)
        changes["int16_nodes"] = int16
        changes["node_methods"] = {n: (r.calibration_type, r.max_percentile or 1.0) for n, r in resolved.items()
                                   if r.calibration_type}
    high = placement.high_precision_nodes
    if high:
        changes["high_precision_outputs"] = frozenset(o for n in high for o in node_outputs.get(n, ()) if o)
    return options.with_(**changes) if changes else options


__all__ = ["LevelConfig", "MODEL", "MODEL_CALIBRATION_TYPES", "NODE", "NODE_CALIBRATION_TYPES", "OP", "QTYPES",
           "QuantConfig", "QuantConfigValue", "Resolved", "configured_nodes", "parse_quant_config"]
