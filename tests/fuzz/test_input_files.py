"""Input files of hrt_model_exec (--input_file) and hb_verifier (-i) fuzzed.

Files of every kind the tools read (raw .bin, .npy, .txt, .png/.jpg) with the
wrong size, dtype, shape or content, and -i arguments naming wrong inputs:
reading them and running the model on what was read gives outputs or one
user error, never another exception. A share of the files are right for the
model (any values, in each form the tool reads): those must be read and run,
and the tests assert that a good share of all examples reach a model run.
"""
import io
import os

import numpy as np
from hypothesis import strategies as st

from bpuemu.common.errors import BpuEmuError
from bpuemu.common.input_types import rt_byte_size, rt_shape

from fuzzing import assert_share, run_counted

SUFFIXES = [".bin", ".npy", ".txt", ".png", ".jpg", ".jpeg", ".raw", ""]
#: What hb_verifier -i takes (bpuemu.host.verifier.inputs.SUFFIXES).
VERIFIER_SUFFIXES = [".bin", ".npy", ".png", ".jpg", ".jpeg"]
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


@st.composite
def valid_contents(draw, spec, suffixes):
    """A file right for the input ``spec``: any values, as raw bytes, .npy, text or (images) a picture."""
    featuremap = spec.input_type_rt == "featuremap"
    dtype = np.dtype(spec.model_dtype or "float32") if featuremap else np.dtype("uint8")
    count = rt_byte_size(spec) // dtype.itemsize
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = (rng.standard_normal(count) * 10).astype(dtype) if featuremap else rng.integers(0, 256, count, dtype)
    kinds = {".bin": "raw", ".raw": "raw", "": "raw", ".npy": "npy", ".txt": "txt",
             ".png": "image", ".jpg": "image", ".jpeg": "image"}
    suffix = draw(st.sampled_from([x for x in suffixes if not (featuremap and kinds[x] == "image")]))
    kind = kinds[suffix]
    if kind == "raw":
        return suffix, values.tobytes()
    if kind == "npy":
        buf = io.BytesIO()
        np.save(buf, values if spec.input_type_rt == "nv12" else values.reshape(rt_shape(spec)), allow_pickle=False)
        return suffix, buf.getvalue()
    if kind == "txt":
        return suffix, " ".join(map(repr, values.tolist())).encode()
    from PIL import Image

    w, h = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), np.uint8)).save(buf, format="PNG" if suffix == ".png" else "JPEG")
    return suffix, buf.getvalue()


def _run(model, inputs) -> str:
    try:
        model.run(inputs)
    except BpuEmuError:
        return "refused at run"
    return "ran"


def _write(tmp: str, stem: str, content) -> str:
    suffix, data = content
    path = os.path.join(tmp, stem + suffix)
    with open(path, "wb") as f:
        f.write(data)
    return path


def check_hrt_model_exec(tmp: str, model, content, valid: bool) -> str:
    from bpuemu.board.runtime.inputs import read_inputs

    path = _write(tmp, "input", content)
    try:
        inputs = read_inputs([path], model.model.input_specs)
    except BpuEmuError as exc:
        assert not valid, f"a right {content[0] or 'raw'} file was refused: {exc}"
        return "refused at read"
    outcome = _run(model, inputs)
    assert outcome == "ran" or not valid, f"a right {content[0] or 'raw'} file did not run"
    return outcome


def check_hb_verifier(tmp: str, model, content, valid: bool, arg_form: str, name: str) -> str:
    from bpuemu.host.verifier.inputs import load_inputs

    path = _write(tmp, "vinput", content)
    value = {"plain": path, "named": f"{name}:{path}", "two": f"{path},{path}", "empty": "", "comma": ","}[arg_form]
    valid = valid and (arg_form == "plain" or (arg_form == "named" and name == model.model.input_specs[0].name))
    try:
        inputs = load_inputs(value, model.model.input_specs)
    except BpuEmuError as exc:
        assert not valid, f"-i {value!r}, a right {content[0]} file, was refused: {exc}"
        return "refused at read"
    outcome = _run(model, [i.data for i in inputs])
    assert outcome == "ran" or not valid, f"-i {value!r}, a right {content[0]} file, did not run"
    return outcome


def properties(tmp: str, sample_bins):
    from bpuemu.board.runtime import Runtime

    models = {}
    for kind, path in sample_bins.items():
        rt = Runtime()
        rt.load(path)
        models[kind] = rt.model()
    kinds = sorted(models)

    def per_model(suffixes, only_right=False):
        """(model, (content, whether it is right for the model)): half of them right, or all."""
        def contents(model):
            spec = model.model.input_specs[0]
            right = st.tuples(valid_contents(spec, suffixes), st.just(True))
            return right if only_right else st.one_of(right, st.tuples(file_contents(rt_byte_size(spec)), st.just(False)))
        return st.sampled_from(kinds).flatmap(lambda k: st.tuples(st.just(models[k]), contents(models[k])))

    names = sorted({m.model.input_specs[0].name for m in models.values()})
    right_args = st.tuples(st.sampled_from(["plain", "named"]), st.sampled_from(names))
    any_args = st.tuples(st.sampled_from(["plain", "named", "two", "empty", "comma"]),
                         st.sampled_from(names + ["nope", "", "data:x"]))
    verifier = st.one_of(st.tuples(per_model(VERIFIER_SUFFIXES, only_right=True), right_args),
                         st.tuples(per_model(VERIFIER_SUFFIXES), any_args)).map(lambda a: (a[0], *a[1]))
    return {
        "hrt_model_exec_input_file": (per_model(SUFFIXES), lambda a: check_hrt_model_exec(tmp, a[0], *a[1])),
        "hb_verifier_input_file": (verifier, lambda a: check_hb_verifier(tmp, a[0][0], *a[0][1], a[1], a[2])),
    }


def test_hrt_model_exec_input_files(tmp_path, sample_bins):
    strategy, check = properties(str(tmp_path), sample_bins)["hrt_model_exec_input_file"]
    assert_share(run_counted(strategy, check), "ran", 0.3)


def test_hb_verifier_input_files(tmp_path, sample_bins):
    strategy, check = properties(str(tmp_path), sample_bins)["hb_verifier_input_file"]
    assert_share(run_counted(strategy, check), "ran", 0.3)
