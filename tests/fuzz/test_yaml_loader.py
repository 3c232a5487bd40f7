"""The makertbin yaml loader fuzzed: every document is a config or one user error (ConfigError).

Documents come from the key schema (host/config/tables.py: the seed's four
groups, their keys, value kinds, choices, ranges and the rules between keys):

- complete configs, consistent by construction: one to three inputs whose
  input_type_train / input_type_rt pair, layouts, shape, norm_type with its
  mean/scale, calibration data and input_source agree; every optional key of
  every group now and then, in each spelling the loader reads (True / 'true',
  5 / '5', a ';'-list or a yaml list). Each comes with the model inputs it
  describes (names and shapes, some dynamic where the yaml gives the shape),
  and must load and then complete against them, as makertbin does;
- those configs against another model (an input less or more, renamed, or of
  another shape), and with one to three keys deleted, set to another value
  from the key's table or to anything, or with an unknown key or group added;
- documents of known groups and keys with values often right, often of the
  wrong type or range; some of all of these damaged as text.

The test asserts that at least 30% of the examples load, so the rules between
keys and the completion are fuzzed, not only the first check a document meets.
"""
import functools
import os

import yaml
from hypothesis import strategies as st

from bpuemu.common.errors import BpuEmuError
from bpuemu.host.config import tables as T

from fuzzing import assert_share, run_counted

ANY = st.recursive(st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=12),
                   lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                   max_leaves=6)
#: The model the documents not built for a model are completed against.
ANY_MODEL = (("data", (1, 3, 16, 16)), ("input", (None, 3, None, None)))
#: Files the configs name, made in the fuzz directory.
FILES = ("model.onnx", "model.caffemodel", "model.prototxt", "op.py")
#: Node names, one pool per key that places nodes, so that no node is put on the BPU and the CPU at once.
NODE_INFO_NODES, CPU_NODES, BPU_NODES = ("Conv_0", "Relu_1"), ("Add_2", "Softmax_3"), ("Mul_4",)


# --- complete configs, consistent by construction ----------------------------------------

# Strategies made once: making them inside every draw took most of the test's time.
BOOLS = st.sampled_from([True, False, "True", "false"])
NAME = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
PREFIX = st.from_regex(r"[A-Za-z][A-Za-z0-9_.-]{0,11}", fullmatch=True)
NUMBER = st.floats(-300, 300, allow_nan=False).map(str)


NODE_INFO = st.one_of(
    st.dictionaries(st.sampled_from(NODE_INFO_NODES), st.fixed_dictionaries({}, optional={
        "ON": st.sampled_from(T.NODE_PLACEMENTS), "InputType": st.just("int16"), "InputType0": st.just("int16"),
        "OutputType": st.just("int16")}).filter(bool), min_size=1),
    st.lists(st.sampled_from(NODE_INFO_NODES), min_size=1, unique=True).map(lambda xs: ";".join(f"{x}:int16" for x in xs)))


@functools.lru_cache(maxsize=None)
def _ints(lo: int, hi: int):
    """An integer as yaml reads it: a number or its text."""
    return st.tuples(st.integers(lo, hi), st.booleans()).map(lambda a: str(a[0]) if a[1] else a[0])


@functools.lru_cache(maxsize=None)
def _subsets(pool: tuple):
    return st.lists(st.sampled_from(pool), min_size=1, max_size=len(pool), unique=True)


@functools.lru_cache(maxsize=None)
def _numbers(count: int):
    return st.lists(NUMBER, min_size=count, max_size=count).map(" ".join)


def _values_list(draw, values):
    """A multi-value key: 'a;b' or a yaml list (or, for one value, the value alone)."""
    values = [str(v) for v in values]
    forms = [";".join(values), "; ".join(values), values] + ([values[0]] if len(values) == 1 else [])
    return draw(st.sampled_from(forms))


def _names(draw, pool):
    return draw(_subsets(tuple(pool)))


def _maybe(draw, body: dict, key: str, value) -> None:
    """Set an optional key half of the time: to a value drawn from ``value``, a strategy or a function."""
    if draw(st.booleans()):
        body[key] = value() if callable(value) else draw(value)


@st.composite
def _one_input(draw):
    """One input's settings, consistent with each other, and the model's shape for it."""
    train = draw(st.sampled_from(T.INPUT_TYPES_TRAIN))
    rt = draw(st.sampled_from(T.RT_TYPES_FOR_TRAIN[train]))
    layout = draw(st.sampled_from(T.LAYOUTS))
    if train == "featuremap":
        shape = (1, *draw(st.lists(st.integers(1, 64), max_size=3)))
    else:
        step = 2 if rt in T.EVEN_SIZE_RT_TYPES else 1
        h, w = draw(st.integers(1, 32)) * step, draw(st.integers(1, 32)) * step
        c = T.CHANNELS_OF_TRAIN_TYPE[train]
        shape = (1, c, h, w) if layout == "NCHW" else (1, h, w, c)
    channels = (shape[1] if layout == "NCHW" else shape[3]) if len(shape) == 4 else None
    def values():
        return draw(_numbers(draw(st.sampled_from([1, channels] if channels else [1]))))

    norm = draw(st.sampled_from(T.NORM_TYPES))
    need_mean, need_scale = T.NORM_NEEDS[norm]
    shape_in_yaml = draw(st.booleans())
    if shape_in_yaml:  # the model's shape may then be dynamic, or unknown
        model_shape = draw(st.one_of(st.none(), st.tuples(*[st.sampled_from([d, None, 0, -1]) for d in shape])))
    else:
        model_shape = shape
    sources = ["ddr"] + (list(T.CAMERA_SOURCES) if rt in T.CAMERA_SOURCE_RT_TYPES else [])
    return {
        "input_type_train": train, "input_type_rt": rt, "input_layout_train": layout, "norm_type": norm,
        "input_layout_rt": draw(st.sampled_from(list(T.LAYOUTS) + ["None"])),
        "input_space_and_range": draw(st.sampled_from(T.INPUT_SPACES)) if rt in T.SPACE_AND_RANGE_RT_TYPES else "regular",
        "input_shape": "x".join(map(str, shape)) if shape_in_yaml else "None",
        "mean_value": values() if need_mean else "None", "scale_value": values() if need_scale else "None",
        "cal_data_type": draw(st.sampled_from(list(T.CAL_DATA_TYPES) + ["None"])),
        "source": draw(st.one_of(st.none(), st.sampled_from(sources))), "model_shape": model_shape, "rank": len(shape),
    }


@st.composite
def configs(draw, tmp: str):
    """(document, --model-type, model inputs): a complete config for that model, which must load and complete."""
    n = draw(st.integers(1, 3))
    names = draw(st.lists(NAME, min_size=n, max_size=n, unique=True))
    inputs = [draw(_one_input()) for _ in range(n)]
    path = lambda name: draw(st.sampled_from([name, os.path.join(tmp, name)]))  # noqa: E731 (relative or absolute)

    model_type = draw(st.sampled_from([None, "onnx", "caffe"]))
    mp = {"march": "bayes-e", "output_model_file_prefix": draw(PREFIX)}
    if model_type == "caffe" or (model_type is None and draw(st.booleans())):
        mp.update(caffe_model=path("model.caffemodel"), prototxt=path("model.prototxt"))
    else:
        mp["onnx_model"] = path("model.onnx")
    _maybe(draw, mp, "working_dir", st.sampled_from(["model_output", os.path.join(tmp, "out")]))
    _maybe(draw, mp, "layer_out_dump", BOOLS)
    _maybe(draw, mp, "output_nodes", lambda: _values_list(draw, _names(draw, CPU_NODES + BPU_NODES)))
    _maybe(draw, mp, "remove_node_type", lambda: _values_list(draw, _names(draw, T.REMOVE_NODE_TYPES)))
    _maybe(draw, mp, "remove_node_name", lambda: _values_list(draw, _names(draw, CPU_NODES)))
    _maybe(draw, mp, "set_node_data_type", lambda: _values_list(draw, [f"{x}:int16" for x in _names(draw, BPU_NODES)]))
    _maybe(draw, mp, "debug_mode", st.sampled_from(T.DEBUG_MODES))
    _maybe(draw, mp, "node_info", NODE_INFO)

    per_input = lambda key: _values_list(draw, [i[key] for i in inputs])  # noqa: E731
    ip = {k: per_input(k) for k in ("input_type_train", "input_type_rt", "input_layout_train", "norm_type")}
    if n > 1 or draw(st.booleans()):
        ip["input_name"] = _values_list(draw, names)
    else:
        names = [draw(st.sampled_from([names[0], "data"]))]  # the model's name for the one input
    needed = {"input_shape": any(i["input_shape"] != "None" for i in inputs),
              "input_space_and_range": any(i["input_space_and_range"] != "regular" for i in inputs),
              "mean_value": any(i["mean_value"] != "None" for i in inputs),
              "scale_value": any(i["scale_value"] != "None" for i in inputs)}
    for key in ("input_layout_rt", "input_space_and_range", "input_shape", "mean_value", "scale_value"):
        if needed.get(key) or draw(st.booleans()):
            ip[key] = per_input(key)
    _maybe(draw, ip, "input_batch", _ints(1, 8))

    ctype = draw(st.one_of(st.none(), st.sampled_from(T.CALIBRATION_TYPES)))
    cp = {} if ctype is None else {"calibration_type": ctype}
    if (ctype or "default") not in T.CALIBRATION_TYPES_WITHOUT_DATA or draw(st.booleans()):
        cp["cal_data_dir"] = _values_list(draw, [path("cal") for _ in inputs])
    if draw(st.booleans()):
        cp["cal_data_type"] = per_input("cal_data_type")
    if all(i["rank"] == 4 for i in inputs):
        _maybe(draw, cp, "preprocess_on", BOOLS)
    _maybe(draw, cp, "max_percentile", st.floats(0.5, 1.0).flatmap(lambda v: st.sampled_from([v, str(v)])))
    _maybe(draw, cp, "per_channel", BOOLS)
    _maybe(draw, cp, "run_on_cpu", lambda: _values_list(draw, _names(draw, CPU_NODES)))
    _maybe(draw, cp, "run_on_bpu", lambda: _values_list(draw, _names(draw, BPU_NODES)))
    switches = [s for s in T.OPTIMIZATION_SWITCHES if not s.startswith("set_model_output_")
                and not (s == "asymmetric" and (ctype or "default") == "default")]
    optimization = _names(draw, switches + ["set_Conv_input_int16", "set_Add_output_int16"])
    optimization += draw(st.lists(st.sampled_from(["set_model_output_int8", "set_model_output_int16"]), max_size=1))
    _maybe(draw, cp, "optimization", lambda: _values_list(draw, optimization))

    mode = draw(st.sampled_from(T.COMPILE_MODES))
    comp = {"compile_mode": mode, "optimize_level": draw(st.sampled_from(T.OPTIMIZE_LEVELS))}
    if mode == "balance" or draw(st.booleans()):
        comp["balance_factor"] = draw(_ints(0, 100))
    _maybe(draw, comp, "debug", BOOLS)
    _maybe(draw, comp, "core_num", st.sampled_from([1, "1"]))
    sources = {name: i["source"] for name, i in zip(names, inputs) if i["source"]}
    if sources:
        comp["input_source"] = sources
    _maybe(draw, comp, "max_time_per_fc", st.one_of(_ints(0, 0), _ints(1000, 2**32 - 1)))
    _maybe(draw, comp, "jobs", _ints(1, 64))
    _maybe(draw, comp, "advice", _ints(0, 1000))

    doc = {"model_parameters": mp, "input_parameters": ip, "calibration_parameters": cp, "compiler_parameters": comp}
    if draw(st.booleans()):
        doc["custom_op"] = {"custom_op_method": "register", "op_register_files": "op.py"}
        _maybe(draw, doc["custom_op"], "custom_op_dir", st.sampled_from([".", tmp]))
    model = list(zip(names, (i["model_shape"] for i in inputs)))
    return doc, model_type, tuple(draw(st.permutations(model)))


def _other_model(draw, model):
    """The model, changed: an input less or more, one renamed, or one's shape different."""
    model = list(model)
    if not model:
        return (("data", (1, 3, 8, 8)),)
    i = draw(st.integers(0, len(model) - 1))
    name, shape = model[i]
    change = draw(st.sampled_from(["drop", "add", "rename", "reshape"]))
    if change == "drop":
        del model[i]
    elif change == "add":
        model.append(("extra_input", (1, 3, 8, 8)))
    elif change == "rename":
        model[i] = (name + "_", shape)
    else:
        shape = shape or (1, 3, 8, 8)
        j = draw(st.integers(0, len(shape) - 1))
        new = draw(st.sampled_from([None, 7, 1000])) if shape[j] else 7
        model[i] = (name, draw(st.sampled_from([shape[:j] + (new,) + shape[j + 1:], shape + (1,)])))
    return tuple(model)


@st.composite
def damaged_configs(draw, tmp: str):
    """A complete config with 1..3 keys deleted, set to another value from the key's table or to anything,
    or with an unknown key or group added."""
    doc, model_type, model = draw(configs(tmp))
    for _ in range(draw(st.integers(1, 3))):
        group = draw(st.sampled_from(sorted(doc)))
        body = doc[group]
        action = draw(st.sampled_from(["delete", "table", "anything", "unknown key", "unknown group"]))
        if action == "unknown group" or not isinstance(body, dict):
            doc[draw(st.sampled_from(["extra_group", group, "model_parameter"]))] = draw(ANY)
        elif action == "delete" and body:
            del body[draw(st.sampled_from(sorted(body)))]
        elif action == "table" and group in T.GROUPS:
            p = draw(st.sampled_from(T.GROUPS[group]))
            body[p.key] = draw(_good_value(p, tmp))
        elif action == "unknown key":
            body[draw(st.sampled_from(["unknown_key", *T.GROUP_OF_KEY, *T.GROUPS]))] = draw(ANY)
        else:
            body[draw(st.sampled_from(sorted(body) or ["unknown_key"]))] = draw(ANY)
    return doc, model_type, model


# --- documents of known groups and keys, values often right, often not ------------------------

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


def _damage(draw, text: str) -> str:
    """A fifth of the time: the text cut, or a random character inserted."""
    if draw(st.integers(0, 4)) == 0 and text:
        i = draw(st.integers(0, len(text)))
        text = text[:i] if draw(st.booleans()) else text[:i] + draw(st.sampled_from(list(":-[]{}'\"\t&*!|>%@`#\n"))) + text[i:]
    return text


@st.composite
def examples(draw, tmp: str):
    """(yaml text, --model-type, check_files, model inputs, whether it must load and complete)."""
    check_files = draw(st.booleans())
    kind = draw(st.sampled_from(["right", "another model", "damaged", "anything"]))
    if kind in ("right", "another model"):
        doc, model_type, model = draw(configs(tmp))
        if kind == "another model":
            model = _other_model(draw, model)
        return yaml.safe_dump(doc, allow_unicode=True), model_type, check_files, model, kind == "right"
    if kind == "damaged":
        doc, model_type, model = draw(damaged_configs(tmp))
    else:
        doc, model_type, model = draw(documents(tmp)), draw(st.sampled_from([None, "onnx", "caffe"])), ANY_MODEL
    return _damage(draw, yaml.safe_dump(doc, allow_unicode=True)), model_type, check_files, model, False


def check_yaml(tmp: str, text: str, model_type, check_files: bool, model_inputs, right: bool) -> str:
    """Load the text as makertbin does, then complete it against the model's inputs; the outcome."""
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
        assert not right, f"a complete config was refused ({exc}):\n{text}"
        return "refused at load"
    assert isinstance(cfg, MapperConfig)
    try:
        done = complete_config(cfg, model_inputs)
    except BpuEmuError as exc:
        assert str(exc).strip(), "an error with no message"
        assert not right, f"a complete config did not complete against {model_inputs} ({exc}):\n{text}"
        return "refused at completion"
    assert [i.name for i in done.inputs] and all(i.input_shape for i in done.inputs)
    return "completed"


def properties(tmp: str):
    os.makedirs(os.path.join(tmp, "cal"), exist_ok=True)
    for name in FILES:
        open(os.path.join(tmp, name), "wb").close()
    return {"yaml_documents": (examples(tmp), lambda args: check_yaml(tmp, *args))}


def test_yaml_loader(tmp_path):
    strategy, check = properties(str(tmp_path))["yaml_documents"]
    outcomes = run_counted(strategy, check)
    assert_share(outcomes, ("refused at completion", "completed"), 0.3)   # they load
    assert_share(outcomes, "refused at completion", 0.1)                   # the completion's checks are fuzzed
    assert_share(outcomes, "refused at load", 0.2)                          # and so are the loader's
