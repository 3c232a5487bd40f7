"""Image preprocessing shared by calibration (preprocess_on) and hb_eval_preprocess: one implementation.

An image goes through three steps, each described by data:

1. geometry (``ImageTransforms``): resize mode (stretch / short_side / fit),
   centre crop, padding (centre or bottom-right, with a fill value) and the
   resampling filter, giving an HxWx3 uint8 RGB array of the model's size;
2. colour (``rgb_to_train``): rgb, bgr, yuv444 or gray, the input_type_train
   form calibration works in;
3. the board's input_type_rt bytes: caldata's ``train_to_rt`` (nv12 chroma
   subsampling, video range, rt layout), the very function calibration uses.

Calibration with ``preprocess_on: True`` is ``ImageTransforms(height, width)``
(stretch, bilinear) followed by steps 2 and 3, so hb_eval_preprocess with an
entry configured alike writes exactly the bytes calibration converts.
Pillow does the decoding and resampling.
"""
from dataclasses import dataclass, fields
from typing import Any, Dict

import numpy as np

from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import rgb_to_yuv444

RESIZE_MODES = ("stretch", "short_side", "fit")
CROP_MODES = ("none", "center")
PAD_MODES = ("none", "center", "bottom_right")
INTERPOLATIONS = ("bilinear", "nearest", "bicubic", "lanczos", "box", "hamming")
COLOURS = ("rgb", "bgr", "yuv444", "gray")


@dataclass(frozen=True)
class ImageTransforms:
    """How an image becomes ``height`` x ``width`` RGB.

    * ``stretch``: resize to height x width (the aspect ratio changes), or with
      ``resize_to`` to a resize_to square, then crop (``crop: center``);
    * ``short_side``: scale the short side to ``resize_to`` (0: the larger of
      height and width), then crop (``crop: center``) to height x width;
    * ``fit``: scale so the image fits inside height x width keeping its aspect
      ratio, then pad to height x width (``pad``: center = letterbox, or
      bottom_right) with ``pad_value``.
    """

    height: int
    width: int
    resize: str = "stretch"
    resize_to: int = 0
    crop: str = "none"
    pad: str = "none"
    pad_value: int = 0
    interpolation: str = "bilinear"

    def __post_init__(self):
        for value, allowed, what in ((self.resize, RESIZE_MODES, "resize"), (self.crop, CROP_MODES, "crop"),
                                     (self.pad, PAD_MODES, "pad"), (self.interpolation, INTERPOLATIONS, "interpolation")):
            if value not in allowed:
                raise InvalidInput(f"{what} '{value}' is not one of {', '.join(allowed)}")
        if self.height <= 0 or self.width <= 0:
            raise InvalidInput(f"image size {self.height}x{self.width} must be positive")
        if not 0 <= self.pad_value <= 255:
            raise InvalidInput(f"pad_value {self.pad_value} is not a 0..255 byte")

    @classmethod
    def from_dict(cls, entry: Dict[str, Any]) -> "ImageTransforms":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in entry.items() if k in known})


def _filter(name: str):
    from PIL import Image

    return getattr(Image.Resampling, name.upper())


def load_rgb(path: str):
    """The image at ``path`` as a PIL RGB image; an unreadable file is one InvalidInput line."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such image") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidInput(f"{path}: not a readable image ({exc.__class__.__name__}: {exc})") from None


def transform_image(img, t: ImageTransforms) -> np.ndarray:
    """A PIL RGB image -> t.height x t.width x 3 uint8 RGB."""
    resample = _filter(t.interpolation)
    h, w = t.height, t.width
    if t.resize == "stretch" and not t.resize_to:
        return np.asarray(img.resize((w, h), resample))
    iw, ih = img.size
    if t.resize in ("stretch", "short_side"):
        short = t.resize_to or max(h, w)
        scale = short / min(iw, ih)
        size = (short, short) if t.resize == "stretch" else (max(1, round(iw * scale)), max(1, round(ih * scale)))
        img = img.resize(size, resample)
        if t.crop == "center":
            iw, ih = img.size
            left, top = max(0, (iw - w) // 2), max(0, (ih - h) // 2)
            img = img.crop((left, top, left + w, top + h))  # PIL fills outside the image with black
        rgb = np.asarray(img)
        if rgb.shape[:2] != (h, w):
            raise InvalidInput(f"{t.resize} to {short} without crop gives {rgb.shape[1]}x{rgb.shape[0]}, "
                               f"not the model's {w}x{h}: set crop: center")
        return rgb
    scale = min(w / iw, h / ih)  # fit
    nw, nh = max(1, min(w, round(iw * scale))), max(1, min(h, round(ih * scale)))
    canvas = np.full((h, w, 3), t.pad_value, np.uint8)
    top, left = ((h - nh) // 2, (w - nw) // 2) if t.pad == "center" else (0, 0)
    canvas[top:top + nh, left:left + nw] = np.asarray(img.resize((nw, nh), resample))
    return canvas


def rgb_to_train(rgb: np.ndarray, colour: str) -> np.ndarray:
    """HxWx3 uint8 RGB -> HxWxC uint8 in ``colour`` (an input_type_train image form)."""
    if colour == "rgb":
        return rgb
    if colour == "bgr":
        return np.ascontiguousarray(rgb[..., ::-1])
    if colour == "yuv444":
        return rgb_to_yuv444(rgb)
    if colour == "gray":
        return rgb_to_yuv444(rgb)[..., :1]
    raise InvalidInput(f"colour '{colour}' is not one of {', '.join(COLOURS)}")
