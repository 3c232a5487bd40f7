"""The seed's data-preparation transformers (``horizon_tc_ui.data.transformer``), on bpuemu's one transforms module.

Each class is a callable on one image, with the toolchain's names, arguments
and defaults::

    transformers = [ShortSideResizeTransformer(short_size=256), CenterCropTransformer(crop_size=224),
                    HWC2CHWTransformer(), RGB2BGRTransformer(), ScaleTransformer(scale_value=255)]
    image = skimage.img_as_float(skimage.io.imread(src_image))
    for trans in transformers:
        image = trans(image)

Called with an array, a transformer returns the transformed array (as the
seed's ``convert_image()`` uses them); called with a list of images, as the
toolchain's own loaders call them, it returns the list of results.

The geometry (resize, short-side resize, centre crop, letterbox) is
``bpuemu.host.convert.transforms``, the code makertbin's ``preprocess_on`` and
hb_eval_preprocess use; the colour conversions are ``bpuemu.common.input_types``,
the board's. So a pipeline configured like a calibration writes the bytes
calibration converts (see that module's doc for how 0..1 skimage floats and
0..255 opencv arrays are resampled alike). Colour conversions work on 0..255
values (after ``ScaleTransformer(255)`` for a skimage read) and give whole
numbers (rounded, as the board's conversion), as float32.
"""
from typing import Sequence, Tuple

import numpy as np

from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import rgb_to_nv12, rgb_to_yuv444, to_model_input
from bpuemu.common.proto import model_pb2
from bpuemu.host.convert import transforms

#: The toolchain's ``interpolation`` values (OpenCV's names) -> Pillow's filters.
_INTERPOLATIONS = {"": "bilinear", "INTER_LINEAR": "bilinear", "INTER_CUBIC": "bicubic", "INTER_NEAREST": "nearest",
                   "INTER_AREA": "box", "INTER_LANCZOS4": "lanczos"}
#: ResizeTransformer's skimage ``method`` (the spline order) -> Pillow's filters.
_ORDERS = {0: "nearest", 1: "bilinear", 3: "bicubic"}


def _interpolation(name: str) -> str:
    if name not in _INTERPOLATIONS:
        raise InvalidInput(f"interpolation '{name}' is not one of {', '.join(n for n in _INTERPOLATIONS if n)}")
    return _INTERPOLATIONS[name]


def _data_type(image: np.ndarray, data_type: str) -> np.ndarray:
    if data_type == "uint8":
        return image.astype(np.uint8)
    if data_type == "float":
        return image.astype(np.float32)
    raise InvalidInput(f"data_type '{data_type}' is not float or uint8")


def _channel_axis(data_format: str) -> int:
    fmt = data_format.upper()
    if fmt not in ("CHW", "HWC"):
        raise InvalidInput(f"data_format '{data_format}' is not CHW or HWC")
    return 0 if fmt == "CHW" else 2


def _hwc(image: np.ndarray, data_format: str) -> np.ndarray:
    return np.moveaxis(image, 0, -1) if _channel_axis(data_format) == 0 else image


def _from_hwc(image: np.ndarray, data_format: str) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(image, -1, 0)) if _channel_axis(data_format) == 0 else image


def _bytes(image: np.ndarray) -> np.ndarray:
    """0..255 values as uint8 (rounded, clipped): what the board's colour conversions take."""
    if image.dtype == np.uint8:
        return image
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


class Transformer:
    """Base class: ``run_transform`` on one image; ``__call__`` on an image or a list of images."""

    def __call__(self, data):
        if isinstance(data, (list, tuple)):
            return [self.run_transform(np.asarray(d)) for d in data]
        return self.run_transform(np.asarray(data))

    def run_transform(self, data: np.ndarray) -> np.ndarray:
        return data


class AddTransformer(Transformer):
    def __init__(self, value):
        self.value = value

    def run_transform(self, data):
        return (data.astype(np.float32) + self.value).astype(np.float32)


class MeanTransformer(Transformer):
    """Subtract per-channel means (``data_format`` CHW or HWC)."""

    def __init__(self, means, data_format: str = "CHW"):
        self.means = np.asarray(means, dtype=np.float32)
        self.axis = _channel_axis(data_format)

    def run_transform(self, data):
        means = self.means[:, None, None] if self.axis == 0 and self.means.ndim == 1 else self.means
        return (data - means).astype(np.float32)


class ScaleTransformer(Transformer):
    def __init__(self, scale_value):
        self.scale_value = scale_value

    def run_transform(self, data):
        return (data * self.scale_value).astype(np.float32)


class NormalizeTransformer(Transformer):
    def __init__(self, std):
        self.std = std

    def run_transform(self, data):
        return (data / self.std).astype(np.float32)


class TransposeTransformer(Transformer):
    def __init__(self, order: Sequence[int]):
        self.order = tuple(order)

    def run_transform(self, data):
        return np.ascontiguousarray(np.transpose(data, self.order))


class HWC2CHWTransformer(TransposeTransformer):
    def __init__(self):
        super().__init__((2, 0, 1))


class CHW2HWCTransformer(TransposeTransformer):
    def __init__(self):
        super().__init__((1, 2, 0))


class ResizeTransformer(Transformer):
    """Resize to ``target_size`` (h, w); bilinear unless ``method`` (skimage's order) or ``interpolation`` say
    otherwise. ``mode`` ('skimage' or 'opencv') is accepted: both resample with the one implementation."""

    def __init__(self, target_size: Tuple[int, int], mode: str = "skimage", method: int = 1, data_type: str = "float",
                 interpolation: str = ""):
        if mode not in ("skimage", "opencv"):
            raise InvalidInput(f"resize mode '{mode}' is not skimage or opencv")
        if method not in _ORDERS:
            raise InvalidInput(f"resize method {method} is not one of {', '.join(map(str, _ORDERS))}")
        self.target_size = tuple(int(v) for v in target_size)
        self.data_type = data_type
        self.interpolation = _interpolation(interpolation) if interpolation else _ORDERS[method]

    def run_transform(self, data):
        h, w = self.target_size
        return _data_type(transforms.resize(data, h, w, self.interpolation), self.data_type)


class ShortSideResizeTransformer(Transformer):
    """Scale so the short side is ``short_size``; the other side is scaled and truncated."""

    def __init__(self, short_size: int, data_type: str = "float", interpolation: str = ""):
        self.short_size = int(short_size)
        self.data_type = data_type
        self.interpolation = _interpolation(interpolation)

    def run_transform(self, data):
        return _data_type(transforms.resize_short_side(data, self.short_size, self.interpolation), self.data_type)


class CenterCropTransformer(Transformer):
    def __init__(self, crop_size: int, data_type: str = "float"):
        self.crop_size = int(crop_size)
        self.data_type = data_type

    def run_transform(self, data):
        return _data_type(transforms.center_crop(data, self.crop_size, self.crop_size), self.data_type)


class LongSideCropTransformer(Transformer):
    """The centred square of the short side's size."""

    def run_transform(self, data):
        side = min(data.shape[:2])
        return transforms.center_crop(data, side, side).astype(np.float32)


class PaddedCenterCropTransformer(Transformer):
    """EfficientNet's centre crop: a square of image_size / (image_size + crop_pad) of the short side."""

    def __init__(self, image_size: int = 224, crop_pad: int = 32):
        self.image_size, self.crop_pad = image_size, crop_pad

    def run_transform(self, data):
        h, w = data.shape[:2]
        side = int(self.image_size / (self.image_size + self.crop_pad) * min(h, w))
        top, left = (h - side + 1) // 2, (w - side + 1) // 2
        return data[top:top + side, left:left + side].astype(np.float32)


class PadResizeTransformer(Transformer):
    """Letterbox: fit inside ``target_size`` (h, w) keeping the aspect ratio, pad with ``pad_value``, the image
    centred (``pad_position='boundary'``) or at the top left (``'bottom_right'``)."""

    def __init__(self, target_size: Tuple[int, int], pad_value: float = 127.0, pad_position: str = "boundary"):
        if pad_position not in ("boundary", "bottom_right"):
            raise InvalidInput(f"pad_position '{pad_position}' is not boundary or bottom_right")
        self.target_size = tuple(int(v) for v in target_size)
        self.pad_value = pad_value
        self.pad = "center" if pad_position == "boundary" else "bottom_right"

    def run_transform(self, data):
        h, w = self.target_size
        return transforms.fit(data, h, w, self.pad, self.pad_value).astype(np.float32)


class TextLineResizeTransformer(Transformer):
    """bpuemu's addition: PaddleOCR's text-line resize for its recogniser and direction classifier
    (``target_size`` e.g. (48, 320)): height to 48, the width following the aspect ratio up to 320, padded on
    the right with ``pad_value``."""

    def __init__(self, target_size: Tuple[int, int], pad_value: float = 127.0):
        self.target_size = tuple(int(v) for v in target_size)
        self.pad_value = pad_value

    def run_transform(self, data):
        h, w = self.target_size
        return transforms.resize_height(data, h, w, self.pad_value).astype(np.float32)


class _ChannelSwap(Transformer):
    def __init__(self, data_format: str = "CHW"):
        self.axis = _channel_axis(data_format)

    def run_transform(self, data):
        if data.shape[self.axis] != 3:
            raise InvalidInput(f"{type(self).__name__}: {data.shape[self.axis]} channels on axis {self.axis} of "
                               f"an image of shape {list(data.shape)}, not 3 (check data_format)")
        return np.ascontiguousarray(np.flip(data, axis=self.axis))


class RGB2BGRTransformer(_ChannelSwap):
    pass


class BGR2RGBTransformer(_ChannelSwap):
    pass


class _ColourConvert(Transformer):
    """RGB or BGR -> yuv444 / gray (BT.601 full range, or video range), optionally minus 128: the board's equations."""

    source = "RGB"
    target = "YUV444"
    offset = 0.0
    space = "regular"

    def __init__(self, data_format: str = "CHW"):
        self.data_format = data_format
        _channel_axis(data_format)

    def run_transform(self, data):
        hwc = _bytes(_hwc(data, self.data_format))
        rgb = hwc[..., ::-1] if self.source == "BGR" else hwc
        yuv = rgb_to_yuv444(np.ascontiguousarray(rgb), self.space)
        out = yuv[..., :1] if self.target == "GRAY" else yuv
        return _from_hwc(out.astype(np.float32) - self.offset, self.data_format)


class RGB2YUV444Transformer(_ColourConvert):
    pass


class BGR2YUV444Transformer(_ColourConvert):
    source = "BGR"


class RGB2YUV444_128Transformer(_ColourConvert):
    offset = 128.0


class BGR2YUV444_128Transformer(_ColourConvert):
    source, offset = "BGR", 128.0


class RGB2YUVBT601VIDEOTransformer(_ColourConvert):
    space, offset = "bt601_video", 128.0


class BGR2YUVBT601VIDEOTransformer(_ColourConvert):
    source, space, offset = "BGR", "bt601_video", 128.0


class RGB2GRAYTransformer(_ColourConvert):
    target = "GRAY"


class BGR2GRAYTransformer(_ColourConvert):
    source, target = "BGR", "GRAY"


class RGB2GRAY_128Transformer(_ColourConvert):
    target, offset = "GRAY", 128.0


class ReduceChannelTransformer(Transformer):
    """Keep the first channel (Y of a YUV image)."""

    def __init__(self, data_format: str = "CHW"):
        self.axis = _channel_axis(data_format)

    def run_transform(self, data):
        return data[:1] if self.axis == 0 else data[..., :1]


class _ToNV12(Transformer):
    """An RGB/BGR image -> NV12 as an (H * 3 / 2) x W uint8 array (the board's conversion: 2x2 chroma mean)."""

    source = "RGB"

    def __init__(self, data_format: str = "CHW", cvt_mode: str = "rgb_calc"):
        if cvt_mode not in ("rgb_calc", "opencv"):
            raise InvalidInput(f"cvt_mode '{cvt_mode}' is not rgb_calc or opencv")
        self.data_format = data_format
        _channel_axis(data_format)

    def run_transform(self, data):
        hwc = _bytes(_hwc(data, self.data_format))
        h, w = hwc.shape[:2]
        if h % 2 or w % 2:
            raise InvalidInput(f"nv12 needs an even height and width, not {h}x{w}")
        rgb = hwc[..., ::-1] if self.source == "BGR" else hwc
        return rgb_to_nv12(np.ascontiguousarray(rgb)).reshape(h * 3 // 2, w)


class RGB2NV12Transformer(_ToNV12):
    pass


class BGR2NV12Transformer(_ToNV12):
    source = "BGR"


class NV12ToYUV444Transformer(Transformer):
    """NV12 bytes of a ``target_size`` (h, w) image -> YUV444 uint8 (chroma replicated 2x2, as the board does)."""

    def __init__(self, target_size: Tuple[int, int], yuv444_output_layout: str = "HWC"):
        self.height, self.width = (int(v) for v in target_size)
        self.layout = yuv444_output_layout
        _channel_axis(yuv444_output_layout)

    def run_transform(self, data):
        spec = model_pb2.InputSpec(name="nv12", input_type_rt="nv12", model_shape=[1, self.height, self.width, 3],
                                   model_layout="NHWC")
        yuv = (to_model_input(_bytes(np.ravel(data)), spec)[0].astype(np.int16) + 128).astype(np.uint8)
        return _from_hwc(yuv, self.layout)


class YUVTransformer(Transformer):
    """An HWC RGB or BGR (``color_sequence``) 0..255 image -> YUV444 through NV12 (chroma subsampled), float32."""

    def __init__(self, color_sequence: str = "RGB"):
        self.source = color_sequence.upper()

    def run_transform(self, data):
        h, w = data.shape[:2]
        nv12 = (BGR2NV12Transformer if self.source == "BGR" else RGB2NV12Transformer)("HWC")(data)
        return NV12ToYUV444Transformer((h, w))(nv12).astype(np.float32)


class F32ToS8Transformer(Transformer):
    def run_transform(self, data):
        return data.astype(np.int8)


class F32ToU8Transformer(Transformer):
    def run_transform(self, data):
        return data.astype(np.uint8)


__all__ = [name for name, obj in list(globals().items())
           if isinstance(obj, type) and issubclass(obj, Transformer) and not name.startswith("_")]
