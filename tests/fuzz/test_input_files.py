"""Input files of hrt_model_exec (--input_file) and hb_verifier (-i) fuzzed.

Files of every kind the tools read (raw .bin, .npy, .txt, .png/.jpg) with the
wrong size, dtype, shape or content, and -i arguments naming wrong inputs:
reading them and running the model on what was read gives outputs or one
user error, never another exception.
"""
import io
import os

import numpy as np
from hypothesis import given, strategies as st

from bpuemu.common.errors import BpuEmuError
from bpuemu.common.input_types import rt_byte_size

SUFFIXES = [".bin", ".npy", ".txt", ".png", ".jpg", ".jpeg", ".raw", ""]
DTYPES = ["uint8", "int8", "float32", "float64", "int64", "bool", "complex64", "<U3", "float16", "V4"]


@st.composite
def file_contents(draw, expected_bytes: int):
    suffix = draw(st.sampled_from(SUFFIXES))
    kind = draw(st.sampled_from(["raw", "npy", "txt", "image", "junk"]))
    if kind == "raw":
        size = draw(st.sampled_from([0, 1, expected_bytes - 1, expected_bytes, expected_bytes + 1, 2 * expected_bytes,
                                     expected_bytes // 4]))
        data = draw(st.binary(min_size=max(size, 0), max_size=max(size, 0)))
    elif kind == "npy":
        dtype = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = tuple(draw(st.lists(st.integers(0, 20), max_size=4)))
        if draw(st.booleans()):  # the expected number of elements, in some shape
            shape = (expected_bytes // max(dtype.itemsize, 1),)
        arr = np.zeros(shape, dtype)
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        data = buf.getvalue()
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
    elif kind == "txt":
        values = draw(st.lists(st.one_of(st.integers(-300, 300).map(str), st.floats(allow_nan=True).map(str),
                                         st.text(max_size=4)), max_size=64))
        data = " ".join(values).encode("utf-8", "replace")
    elif kind == "image":
        from PIL import Image

        w, h = draw(st.integers(1, 40)), draw(st.integers(1, 40))
        mode = draw(st.sampled_from(["RGB", "L", "RGBA", "P", "I;16"]))
        buf = io.BytesIO()
        Image.new(mode, (w, h)).save(buf, format=draw(st.sampled_from(["PNG", "JPEG"])) if mode in ("RGB", "L") else "PNG")
        data = buf.getvalue()
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
    else:
        data = draw(st.binary(max_size=256))
    return suffix, data


def _run(model, inputs) -> None:
    try:
        model.run(inputs)
    except BpuEmuError:
        pass


def check_hrt_model_exec(tmp: str, model, content) -> None:
    from bpuemu.board.runtime.inputs import read_inputs

    suffix, data = content
    path = os.path.join(tmp, "input" + suffix)
    with open(path, "wb") as f:
        f.write(data)
    try:
        inputs = read_inputs([path], model.model.input_specs)
    except BpuEmuError:
        return
    _run(model, inputs)


def check_hb_verifier(tmp: str, model, content, arg_form: str, name: str) -> None:
    from bpuemu.host.verifier.inputs import load_inputs

    suffix, data = content
    path = os.path.join(tmp, "vinput" + suffix)
    with open(path, "wb") as f:
        f.write(data)
    value = {"plain": path, "named": f"{name}:{path}", "two": f"{path},{path}", "empty": "", "comma": ","}[arg_form]
    try:
        inputs = load_inputs(value, model.model.input_specs)
    except BpuEmuError:
        return
    _run(model, [i.data for i in inputs])


def properties(tmp: str, sample_bins):
    from bpuemu.board.runtime import Runtime

    models = {}
    for kind, path in sample_bins.items():
        rt = Runtime()
        rt.load(path)
        models[kind] = rt.model()
    kinds = sorted(models)
    per_model = st.sampled_from(kinds).flatmap(
        lambda k: st.tuples(st.just(models[k]), file_contents(rt_byte_size(models[k].model.input_specs[0]))))
    verifier = st.tuples(per_model, st.sampled_from(["plain", "named", "two", "empty", "comma"]),
                         st.sampled_from(["data", "nope", "", "data:x"]))
    return {
        "hrt_model_exec_input_file": (per_model, lambda a: check_hrt_model_exec(tmp, *a)),
        "hb_verifier_input_file": (verifier, lambda a: check_hb_verifier(tmp, a[0][0], a[0][1], a[1], a[2])),
    }


def test_hrt_model_exec_input_files(tmp_path, sample_bins):
    strategy, check = properties(str(tmp_path), sample_bins)["hrt_model_exec_input_file"]
    given(strategy)(check)()


def test_hb_verifier_input_files(tmp_path, sample_bins):
    strategy, check = properties(str(tmp_path), sample_bins)["hb_verifier_input_file"]
    given(strategy)(check)()
