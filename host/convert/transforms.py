"""Image preprocessing shared by calibration (preprocess_on), hb_eval_preprocess and the seed's
transformer classes (``horizon_tc_ui.data.transformer``): one implementation.

An image goes through three steps, each described by data:

1. geometry (``ImageTransforms``): resize mode (stretch / short_side / fit /
   height), centre crop, padding (centre or bottom-right, with a fill value)
   and the resampling filter, giving an HxWx3 uint8 RGB array of the model's
   size;
2. colour (``rgb_to_train``): rgb, bgr, yuv444 or gray, the input_type_train
   form calibration works in;
3. the board's input_type_rt bytes: caldata's ``train_to_rt`` (nv12 chroma
   subsampling, video range, rt layout), the very function calibration uses.

Calibration with ``preprocess_on: True`` is ``ImageTransforms(height, width)``
(stretch, bilinear) followed by steps 2 and 3, so hb_eval_preprocess with an
entry configured alike writes exactly the bytes calibration converts.

The geometry works on arrays (``resize``, ``resize_short_side``,
``center_crop``, ``fit``, ``resize_height``), as the seed's transformer classes
need: an image read by opencv (uint8 BGR, 0..255) or by skimage (float RGB,
0..1) goes through the same Pillow resampling as a decoded PIL image. A float
array whose values are whole 8-bit steps of its range (skimage's
``img_as_float`` of a decoded image, or whole numbers 0..255) is resampled as
the 8-bit image it is and given back in its own range, so a transformer
pipeline over a skimage read writes, after ``ScaleTransformer(255)`` and
``astype(np.uint8)``, the bytes calibration computes from the same file. Other
float arrays (after a mean was subtracted, say) are resampled per channel in
32-bit float. Sizes follow the toolchain's transformers: the short side's
partner and a letterbox's size are truncated (``int``), a centre crop starts
at ``h // 2 - crop // 2``.
"""
import math
from dataclasses import dataclass, fields
from typing import Any, Dict

import numpy as np

from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import rgb_to_yuv444

RESIZE_MODES = ("stretch", "short_side", "fit", "height")
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
      bottom_right) with ``pad_value``;
    * ``height``: PaddleOCR's text-line resize: scale to ``height`` keeping the
      aspect ratio, the width rounded up and capped at ``width`` (a longer line
      is squeezed), then pad on the right with ``pad_value``.
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

    if name not in INTERPOLATIONS:
        raise InvalidInput(f"interpolation '{name}' is not one of {', '.join(INTERPOLATIONS)}")
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


def _as_bytes(arr: np.ndarray):
    """(uint8 pixels, scale) when ``arr`` holds whole 8-bit steps of 0..1 (scale 255) or 0..255 (scale 1);
    (None, 0) when it does not (a float image after a mean was subtracted, say)."""
    if arr.dtype == np.uint8:
        return arr, 1
    if arr.dtype.kind not in "fiu" or arr.size == 0:
        return None, 0
    x = arr.astype(np.float64)
    lo, hi = float(x.min()), float(x.max())
    for scale in ((255, 1) if arr.dtype.kind == "f" and lo >= 0 and hi <= 1 else (1,)):
        v = np.rint(x * scale)
        if lo >= 0 and hi * scale <= 255 and np.abs(x * scale - v).max() <= 1e-6 * scale:
            return v.astype(np.uint8), scale
    return None, 0


def _back(pixels: np.ndarray, like: np.ndarray, scale: int) -> np.ndarray:
    """uint8 ``pixels`` in the dtype class and range of ``like`` (see _as_bytes)."""
    if like.dtype == np.uint8:
        return pixels
    return pixels / np.float64(scale) if scale != 1 else pixels.astype(np.float64 if like.dtype.kind == "f" else like.dtype)


def resize(arr: np.ndarray, height: int, width: int, interpolation: str = "bilinear") -> np.ndarray:
    """An HxW or HxWxC image array resized to ``height`` x ``width`` with Pillow's ``interpolation``.

    8-bit images (uint8, or floats of whole 8-bit steps, see the module doc)
    are resampled as 8-bit images and returned in their own dtype class and
    range; other floats per channel in 32-bit float (returned as float32).
    """
    from PIL import Image

    resample = _filter(interpolation)
    if arr.ndim not in (2, 3):
        raise InvalidInput(f"an image is HxW or HxWxC, not an array of shape {arr.shape}")
    if arr.shape[:2] == (height, width):
        return arr.copy()
    pixels, scale = _as_bytes(arr)
    if pixels is not None:
        if pixels.ndim == 3 and pixels.shape[2] == 3:
            out = np.asarray(Image.fromarray(np.ascontiguousarray(pixels), "RGB").resize((width, height), resample))
        else:
            planes = pixels[..., None] if pixels.ndim == 2 else pixels
            out = np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(planes[..., c]), "L")
                                       .resize((width, height), resample)) for c in range(planes.shape[2])], axis=-1)
            out = out[..., 0] if pixels.ndim == 2 else out
        return _back(out, arr, scale)
    planes = arr[..., None] if arr.ndim == 2 else arr
    out = np.stack([np.asarray(Image.fromarray(np.ascontiguousarray(planes[..., c], dtype=np.float32), "F")
                               .resize((width, height), resample)) for c in range(planes.shape[2])], axis=-1)
    return out[..., 0] if arr.ndim == 2 else out


def short_side_size(ih: int, iw: int, short: int):
    """(h, w) with the short side ``short`` and the other scaled and truncated, as the toolchain's transformer."""
    if ih < iw:
        return short, int(short * (iw / ih))
    return int(short * (ih / iw)), short


def resize_short_side(arr: np.ndarray, short: int, interpolation: str = "bilinear") -> np.ndarray:
    """Scale so the short side is ``short`` (keeping the aspect ratio)."""
    return resize(arr, *short_side_size(arr.shape[0], arr.shape[1], short), interpolation)


def center_crop(arr: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre ``height`` x ``width`` window (starting at h // 2 - height // 2); zeros where an image
    smaller than the window has no pixels."""
    ih, iw = arr.shape[:2]
    top, left = max(0, ih // 2 - height // 2), max(0, iw // 2 - width // 2)
    window = arr[top:top + height, left:left + width]
    if window.shape[:2] == (height, width):
        return window.copy()
    out = np.zeros((height, width) + arr.shape[2:], arr.dtype)
    out[:window.shape[0], :window.shape[1]] = window
    return out


def fit(arr: np.ndarray, height: int, width: int, pad: str = "center", pad_value: float = 0,
        interpolation: str = "bilinear") -> np.ndarray:
    """Scale to fit inside ``height`` x ``width`` keeping the aspect ratio (sizes truncated), then pad with
    ``pad_value`` (in the image's own range): centred (letterbox) or at the bottom and right."""
    ih, iw = arr.shape[:2]
    scale = min(width / iw, height / ih)
    nh, nw = max(1, min(height, int(scale * ih))), max(1, min(width, int(scale * iw)))
    return _pad(resize(arr, nh, nw, interpolation), height, width, pad, pad_value)


def height_size(ih: int, iw: int, height: int, width: int) -> int:
    """The width PaddleOCR's text-line resize gives an ih x iw line at ``height``, capped at ``width``."""
    return min(width, int(math.ceil(height * iw / ih)))


def resize_height(arr: np.ndarray, height: int, width: int, pad_value: float = 0,
                  interpolation: str = "bilinear") -> np.ndarray:
    """PaddleOCR's text-line resize (rec and cls): to ``height``, the width following the aspect ratio up to
    ``width``, padded on the right with ``pad_value``."""
    nw = height_size(arr.shape[0], arr.shape[1], height, width)
    return _pad(resize(arr, height, nw, interpolation), height, width, "bottom_right", pad_value)


def _pad(arr: np.ndarray, height: int, width: int, pad: str, pad_value: float) -> np.ndarray:
    nh, nw = arr.shape[:2]
    canvas = np.full((height, width) + arr.shape[2:], pad_value, arr.dtype)
    top, left = ((height - nh) // 2, (width - nw) // 2) if pad == "center" else (0, 0)
    canvas[top:top + nh, left:left + nw] = arr
    return canvas


def transform_array(arr: np.ndarray, t: ImageTransforms) -> np.ndarray:
    """An HxWxC image array -> t.height x t.width x C (same dtype class and range)."""
    h, w = t.height, t.width
    if t.resize == "fit":
        return fit(arr, h, w, t.pad, t.pad_value, t.interpolation)
    if t.resize == "height":
        return resize_height(arr, h, w, t.pad_value, t.interpolation)
    if t.resize == "stretch" and not t.resize_to:
        return resize(arr, h, w, t.interpolation)
    short = t.resize_to or max(h, w)
    if t.resize == "stretch":
        arr = resize(arr, short, short, t.interpolation)
    else:
        arr = resize_short_side(arr, short, t.interpolation)
    if t.crop == "center":
        arr = center_crop(arr, h, w)
    if arr.shape[:2] != (h, w):
        raise InvalidInput(f"{t.resize} to {short} without crop gives {arr.shape[1]}x{arr.shape[0]}, "
                           f"not the model's {w}x{h}: set crop: center")
    return arr


def transform_image(img, t: ImageTransforms) -> np.ndarray:
    """A PIL RGB image -> t.height x t.width x 3 uint8 RGB."""
    return transform_array(np.asarray(img), t)


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
