"""The makertbin yaml loader fuzzed: every document is a config or one user error (ConfigError).

Documents are drawn from the key schema (host/config/tables.py): known groups
and keys with values that are often right (a choice, a shape, a ';'-list per
input), often of the wrong type or range, plus unknown keys and groups; some
are then damaged as text (so the YAML parser sees broken documents too).
Loaded configs are also completed against a model's inputs, as makertbin does.
"""
import os

import pytest
import yaml
from hypothesis import given, strategies as st

from bpuemu.common.errors import BpuEmuError
from bpuemu.host.config import tables as T

ANY = st.recursive(st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=12),
                   lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                   max_leaves=6)


def _good_value(p: T.Param, tmp: str):
    if p.choices:
        one = st.sampled_from(p.choices)
    elif p.kind == "bool":
        one = st.sampled_from([True, False, "True", "false"])
    elif p.kind in ("int", "float"):
        lo, hi = (p.ranges or ((0, 100),))[0]
        one = st.integers(int(lo), int(hi)) if p.kind == "int" else st.floats(lo, hi)
    elif p.kind == "shape":
        one = st.lists(st.integers(0, 300), min_size=1, max_size=5).map(lambda d: "x".join(map(str, d)))
    elif p.kind == "values":
        one = st.lists(st.floats(-300, 300, allow_nan=False), min_size=1, max_size=3).map(lambda v: " ".join(map(str, v)))
    elif p.kind == "path":
        one = st.sampled_from([tmp, os.path.join(tmp, "model.onnx"), os.path.join(tmp, "cal"), "missing", ""])
    elif p.kind == "node_info":
        one = st.dictionaries(st.sampled_from(["Conv_0", "Relu_1", ""]),
                              st.dictionaries(st.sampled_from(["ON", "InputType", "OutputType", "InputType0", "bogus"]),
                                              st.sampled_from(["BPU", "CPU", "int16", "int8", "", 3]), max_size=3),
                              max_size=2)
    elif p.kind == "optimization":
        one = st.sampled_from(list(T.OPTIMIZATION_FORMS) + ["set_all_nodes_int16", "nonsense"])
    elif p.kind == "input_source":
        one = st.dictionaries(st.sampled_from(["data", "input", "_default_value"]),
                              st.sampled_from(list(T.INPUT_SOURCES) + ["usb"]), max_size=2)
    else:
        one = st.text(max_size=16)
    if p.is_list:
        one = st.lists(one.map(str), min_size=1, max_size=3).map(";".join) | one
    return one


def documents(tmp: str):
    groups = {}
    for group, params in T.GROUPS.items():
        keys = {p.key: st.one_of(_good_value(p, tmp), _good_value(p, tmp), ANY) for p in params}
        body = st.fixed_dictionaries({}, optional={**keys, "unknown_key": ANY})
        groups[group] = body | ANY
    doc = st.fixed_dictionaries({g: groups[g] for g in T.REQUIRED_GROUPS}, optional={"custom_op": groups["custom_op"],
                                                                                      "extra_group": ANY})
    return doc | ANY


@st.composite
def yaml_texts(draw, tmp):
    text = yaml.safe_dump(draw(documents(tmp)), allow_unicode=True)
    if draw(st.integers(0, 4)) == 0 and text:  # damage the text: cut it, or insert a random character
        i = draw(st.integers(0, len(text)))
        text = text[:i] if draw(st.booleans()) else text[:i] + draw(st.sampled_from(list(":-[]{}'\"\t&*!|>%@`#\n"))) + text[i:]
    return text


def check_yaml(tmp: str, text: str, model_type, check_files: bool) -> None:
    from bpuemu.host.config import load_config
    from bpuemu.host.config.loader import complete_config
    from bpuemu.host.config.model import MapperConfig

    path = os.path.join(tmp, "fuzz.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    try:
        cfg = load_config(path, model_type=model_type, check_files=check_files)
    except BpuEmuError as exc:
        assert str(exc).strip(), "an error with no message"
        return
    assert isinstance(cfg, MapperConfig)
    try:
        complete_config(cfg, [("data", [1, 3, 16, 16]), ("input", [None, 3, None, None])])
    except BpuEmuError:
        pass


def properties(tmp: str):
    os.makedirs(os.path.join(tmp, "cal"), exist_ok=True)
    open(os.path.join(tmp, "model.onnx"), "wb").close()
    strategy = st.tuples(yaml_texts(tmp), st.sampled_from([None, "onnx", "caffe"]), st.booleans())
    return {"yaml_documents": (strategy, lambda args: check_yaml(tmp, *args))}


def test_yaml_loader(tmp_path):
    strategy, check = properties(str(tmp_path))["yaml_documents"]
    given(strategy)(check)()
