"""Reading --input_file: raw .bin, .npy, .txt and .jpg/.jpeg/.png, into input_type_rt form."""
import io
import os
import warnings
from typing import List, Sequence

import numpy as np

from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.common.input_types import image_to_rt, model_hw, rt_shape
from bpuemu.common.proto import model_pb2

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def _rt_dtype(spec: model_pb2.InputSpec) -> np.dtype:
    return np.dtype(spec.model_dtype or "float32") if spec.input_type_rt == "featuremap" else np.dtype("uint8")


def read_image(path: str, spec: model_pb2.InputSpec) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        raise InvalidInput(f"reading {path} needs Pillow", hint="pip install 'bpuemu[images]', or give a .bin/.npy file") from None
    _, h, w, _ = model_hw(spec)
    try:
        with Image.open(path) as img:
            rgb = np.asarray(img.convert("RGB").resize((w, h), Image.BILINEAR))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:  # Pillow's decoders raise all of these
        raise InvalidInput(f"cannot decode image {path}: {exc}") from None
    return image_to_rt(rgb, spec)


def _read_text(path: str, dtype: np.dtype) -> np.ndarray:
    """Numbers separated by white space. Only ASCII reaches numpy's parser: numpy 2.4's loadtxt
    crashes the process (SIGSEGV) on some non-ASCII characters with an integer dtype (found by fuzzing)."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path} is not a text file of {dtype.name} numbers: non-ASCII byte at offset {exc.start}") from None
    try:
        with warnings.catch_warnings():  # "input contained no data": the size check says it better
            warnings.simplefilter("ignore", UserWarning)
            return np.loadtxt(io.StringIO(text), dtype=dtype, ndmin=1).reshape(-1)
    except (ValueError, OverflowError) as exc:
        raise InvalidInput(f"{path} is not a text file of {dtype.name} numbers: {str(exc)[:200]}") from None


def read_input(path: str, spec: model_pb2.InputSpec) -> np.ndarray:
    if not os.path.isfile(path):
        raise NotFound(f"input file not found: {path}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix in IMAGE_SUFFIXES:
        return read_image(path, spec)
    dtype = _rt_dtype(spec)
    if suffix == ".npy":
        try:
            data = np.load(path, allow_pickle=False)
        except (ValueError, EOFError, OSError) as exc:  # pickled, truncated or not .npy at all
            raise InvalidInput(f"{path} is not a plain .npy array: {exc or type(exc).__name__}") from None
        if not isinstance(data, np.ndarray):
            raise InvalidInput(f"{path} is an .npz archive, not one .npy array")
        return data
    if suffix == ".txt":
        data = _read_text(path, dtype)
    else:  # raw bytes, read as the input's dtype
        data = np.fromfile(path, dtype=np.uint8)
        if data.size % dtype.itemsize:
            raise InvalidInput(f"{path} has {data.size} bytes, not a whole number of {dtype.name} values")
        data = data.view(dtype)
    shape = rt_shape(spec)
    if spec.input_type_rt != "nv12" and data.size == int(np.prod(shape)):
        data = data.reshape(shape)
    return data


def read_inputs(files: Sequence[str], specs: Sequence[model_pb2.InputSpec]) -> List[np.ndarray]:
    """One file per model input, in model input order."""
    if len(files) != len(specs):
        names = ", ".join(s.name for s in specs)
        raise InvalidInput(f"the model has {len(specs)} input(s) ({names}) but {len(files)} input file(s) were given",
                           hint="give one file per input, in the model's input order", subject="input_file")
    return [read_input(f, s) for f, s in zip(files, specs)]
