"""Calibration data: read it the way the seeds describe, feed it the way the board will.

Files in each input's cal_data_dir are read in sorted name order (several
inputs pair up by that order):

* ``.npy``: the array itself;
* images (``.jpg .jpeg .png .bmp``) when preprocess_on is set: resized to the
  input's H x W and laid out as input_type_train / input_layout_train, values
  0..255;
* anything else: raw row-major binary of cal_data_type -- or, when that is not
  configured, float32 if the folder name ends in ``_f32`` and uint8 otherwise.

Samples are in input_type_train form (what training used). ``to_model_inputs``
turns them into what the optimized model reads during calibration: for image
inputs exactly the int8 tensor the board's Preprocess makes from the
input_type_rt data (so calibration sees what the board will see, nv12 chroma
subsampling included), as float32; featuremaps unchanged.
"""
import os
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np

from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.common.input_types import (full_to_space, relayout, rgb_to_nv12, rgb_to_yuv444, to_model_input,
                                       yuv444_to_nv12)
from bpuemu.common.proto import model_pb2
from bpuemu.host.convert.transforms import COLOURS, ImageTransforms, load_rgb, rgb_to_train, transform_image

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


@dataclass(frozen=True)
class CalInput:
    """How to read one input's calibration data."""

    name: str
    cal_data_dir: str
    shape: tuple                       # input_shape, train layout
    dtype: Optional[str] = None        # cal_data_type; None: the _f32 rule
    preprocess_on: bool = False
    input_type_train: str = "featuremap"
    input_layout_train: str = "NCHW"

    def resolved_dtype(self) -> np.dtype:
        if self.dtype:
            return np.dtype(self.dtype)
        return np.dtype("float32" if os.path.basename(os.path.normpath(self.cal_data_dir)).endswith("_f32") else "uint8")


def list_files(directory: str) -> List[str]:
    if not os.path.isdir(directory):
        raise NotFound(f"cal_data_dir not found: {directory}")
    files = sorted(f for f in os.listdir(directory) if not f.startswith(".") and os.path.isfile(os.path.join(directory, f)))
    if not files:
        raise InvalidInput(f"cal_data_dir {directory} holds no calibration files")
    return [os.path.join(directory, f) for f in files]


def _read_image(path: str, ci: CalInput) -> np.ndarray:
    """An image resized (stretch, bilinear) to the input's H x W, in input_type_train form (transforms.py)."""
    n, h, w = (ci.shape[0], ci.shape[2], ci.shape[3]) if ci.input_layout_train == "NCHW" else ci.shape[:3]
    rgb = transform_image(load_rgb(path), ImageTransforms(h, w))
    hwc = rgb_to_train(rgb, ci.input_type_train if ci.input_type_train in COLOURS else "rgb").astype(np.float32)
    nhwc = np.broadcast_to(hwc, (n,) + hwc.shape)
    return relayout(np.ascontiguousarray(nhwc), "NHWC", ci.input_layout_train)


def read_sample(path: str, ci: CalInput) -> np.ndarray:
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".npy":
        data = np.load(path, allow_pickle=False)
    elif ci.preprocess_on and suffix in IMAGE_SUFFIXES:
        return _read_image(path, ci)
    elif suffix in IMAGE_SUFFIXES:
        raise InvalidInput(f"{path} is an image but preprocess_on is False",
                           hint="set calibration_parameters.preprocess_on: True, or give preprocessed binary files")
    else:
        dtype = ci.resolved_dtype()
        raw = np.fromfile(path, dtype=np.uint8)
        if raw.size % dtype.itemsize:
            raise InvalidInput(f"calibration file {path} has {raw.size} bytes, not a whole number of {dtype.name} values")
        data = raw.view(dtype)
    want = int(np.prod(ci.shape))
    if data.size != want:
        raise InvalidInput(
            f"calibration file {path} holds {data.size} values of {data.dtype.name}, input '{ci.name}' with input_shape "
            f"{'x'.join(map(str, ci.shape))} needs {want}",
            hint="check cal_data_type (or the _f32 folder suffix) and input_shape",
        )
    return data.reshape(ci.shape)


def iter_samples(inputs: Sequence[CalInput], limit: int = 0) -> Iterator[Dict[str, np.ndarray]]:
    """Samples as {input name: array in input_type_train form}, in file order."""
    lists = [list_files(ci.cal_data_dir) for ci in inputs]
    counts = {ci.name: len(f) for ci, f in zip(inputs, lists)}
    if len(set(counts.values())) > 1:
        raise InvalidInput(f"calibration inputs have different file counts: {counts}")
    n = len(lists[0]) if lists else 0
    for k in range(min(n, limit) if limit else n):
        yield {ci.name: read_sample(files[k], ci) for ci, files in zip(inputs, lists)}


def _train_to_rt(x: np.ndarray, train: str, layout: str, spec: model_pb2.InputSpec) -> np.ndarray:
    """One image sample in input_type_train form -> input_type_rt data, per batch item.

    YUV data is written in the input's input_space_and_range (full-range
    training data is compressed to the video range for bt601_video).
    """
    u8 = x if x.dtype == np.uint8 else np.clip(np.rint(x.astype(np.float32)), 0, 255).astype(np.uint8)
    rt, space = spec.input_type_rt, spec.input_space_and_range
    if rt == train and rt in ("rgb", "bgr", "gray"):
        # The data is the rt data already, in its layout: at most one transpose (the loop below would
        # move it to NHWC and back: 3.9 ms of a 1x3x640x640 sample's 7, numpy transposing bytes).
        return np.ascontiguousarray(relayout(u8, layout or "NHWC", spec.input_layout_rt or "NHWC"))
    nhwc = relayout(u8, layout, "NHWC")
    items = []
    for img in nhwc:
        if rt == train == "yuv444" or rt == "nv12" and train == "yuv444":
            hwc = full_to_space(img, space)
        elif rt == train or rt == "gray":
            hwc = img
        elif rt in ("rgb", "bgr") and train in ("rgb", "bgr"):
            hwc = img[..., ::-1]
        else:  # yuv444 / nv12 from rgb or bgr
            hwc = rgb_to_yuv444(img[..., ::-1] if train == "bgr" else img, space)
        items.append(yuv444_to_nv12(hwc) if rt == "nv12" else hwc)
    if rt == "nv12":
        return np.concatenate(items)
    return relayout(np.ascontiguousarray(np.stack(items)), "NHWC", spec.input_layout_rt or "NHWC")


#: Image in input_type_train form -> the board's input_type_rt data (hb_eval_preprocess writes it too).
train_to_rt = _train_to_rt


def to_model_inputs(sample: Dict[str, np.ndarray], specs: Sequence[model_pb2.InputSpec], trains: Dict[str, tuple]) -> Dict[str, np.ndarray]:
    """Calibration sample -> float32 feed for the original/optimized model.

    ``trains`` maps input name -> (input_type_train, input_layout_train).
    """
    feed = {}
    for spec in specs:
        x = sample[spec.name]
        if spec.input_type_rt == "featuremap":
            feed[spec.plan_tensor] = np.ascontiguousarray(x, dtype=np.float32)
        else:
            train, layout = trains[spec.name]
            rt = _train_to_rt(x, train, layout, spec)
            feed[spec.plan_tensor] = to_model_input(rt, spec).astype(np.float32)
    return feed


__all__ = ["CalInput", "iter_samples", "read_sample", "list_files", "to_model_inputs", "rgb_to_nv12"]
