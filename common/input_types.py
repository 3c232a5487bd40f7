"""input_type_rt conversions: what the application feeds -> what the model reads.

The board runtime receives input in input_type_rt form (nv12 bytes; yuv444,
rgb, bgr, gray as uint8 in input_layout_rt; featuremap as float32) and the
hardware turns it into the model's intermediate type (ptq_guide, "Interpretation
internal process"):

    input_type_rt   nv12        yuv444      rgb      bgr      gray      featuremap
    intermediate    yuv444_128  yuv444_128  RGB_128  BGR_128  GRAY_128  featuremap

where X_128 is the uint8 data minus 128, as int8, in the layout of the
quantized model (quanti.onnx). One converter per input_type_rt, in a registry.

YUV data (nv12, yuv444) comes in one of two BT.601 ranges
(``input_space_and_range``): ``regular`` (full range, Y/U/V in [0, 255], as
JPEG) or ``bt601_video`` (Y in [16, 235], U/V in [16, 240]). The Preprocess
step passes the bytes through either way (the hardware's job is the chroma
upsampling and the -128 shift); the colour equations of the range are applied
by the model's HzPreprocess node (``yuv_to_rgb_affine``), and the inverse
direction (``rgb_to_yuv444``, ``rgb_to_nv12``, ``image_to_rt``) writes the
range the input declares.
"""
from typing import Callable, Dict, List, Sequence

import numpy as np

from bpuemu.common.errors import InvalidInput
from bpuemu.common.proto import model_pb2

INPUT_TYPES_RT = ("nv12", "yuv444", "rgb", "bgr", "gray", "featuremap")
INTERMEDIATE_TYPE = {
    "nv12": "yuv444_128",
    "yuv444": "yuv444_128",
    "rgb": "RGB_128",
    "bgr": "BGR_128",
    "gray": "GRAY_128",
    "featuremap": "featuremap",
}

#: input_space_and_range values: BT.601 full range and video range.
SPACES = ("regular", "bt601_video")

# BT.601 with Kr = 0.299, Kb = 0.114, on full-range (0..255) values.
_RGB2YUV = np.array([[0.299, 0.587, 0.114],
                     [-0.168736, -0.331264, 0.5],
                     [0.5, -0.418688, -0.081312]])
_YUV2RGB = np.array([[1.0, 0.0, 1.402],
                     [1.0, -0.344136, -0.714136],
                     [1.0, 1.772, 0.0]])
_CHROMA = np.array([0.0, 128.0, 128.0])
#: Video range: Y = 16 + 219/255 * Y_full, U/V = 128 + 224/255 * (U/V_full - 128).
_VIDEO_SCALE = np.array([219.0 / 255.0, 224.0 / 255.0, 224.0 / 255.0])
_VIDEO_OFFSET = np.array([16.0, 128.0, 128.0])

_TO_NCHW = (0, 3, 1, 2)
_TO_NHWC = (0, 2, 3, 1)


def minus_128(data: np.ndarray) -> np.ndarray:
    """uint8 -> int8 as x - 128 (the same bits with the top bit flipped)."""
    return (data ^ np.uint8(0x80)).view(np.int8)


def relayout(x: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Transpose a 4-D tensor between NHWC and NCHW (no-op when equal)."""
    if src == dst or not src or not dst:
        return x
    return np.ascontiguousarray(x.transpose(_TO_NCHW if dst == "NCHW" else _TO_NHWC))


def model_hw(spec: model_pb2.InputSpec) -> tuple:
    """(N, H, W, C) of the quantized-model input."""
    n, a, b, c = spec.model_shape
    return (n, b, c, a) if spec.model_layout == "NCHW" else (n, a, b, c)


def rt_shape(spec: model_pb2.InputSpec) -> tuple:
    """The validShape of the input in input_type_rt form."""
    if spec.input_type_rt == "featuremap":  # any rank; not (N, H, W, C)
        return tuple(spec.model_shape)
    n, h, w, c = model_hw(spec)
    if spec.input_type_rt == "nv12":
        return (n, 3, h, w)  # what hrt_model_exec model_info shows for nv12
    c = 1 if spec.input_type_rt == "gray" else 3
    return (n, h, w, c) if spec.input_layout_rt == "NHWC" else (n, c, h, w)


def nv12_row_stride(spec: model_pb2.InputSpec) -> int:
    """Bytes from one nv12 row to the next: the spec's row_stride (a J6 march aligns it), else the width."""
    return int(spec.row_stride) or model_hw(spec)[2]


def rt_byte_size(spec: model_pb2.InputSpec) -> int:
    """alignedByteSize: what one input takes (an nv12 frame with its rows at the march's stride)."""
    if spec.input_type_rt == "featuremap":
        return int(np.prod(spec.model_shape)) * np.dtype(spec.model_dtype or "float32").itemsize
    if spec.input_type_rt == "nv12":
        n, h, _, _ = model_hw(spec)
        return n * h * nv12_row_stride(spec) * 3 // 2
    return int(np.prod(rt_shape(spec)))


def _check_nv12_stride(data: np.ndarray, spec: model_pb2.InputSpec) -> None:
    """An nv12 input of a model whose rows are aligned (a J6 march) must come with rows at that stride: one
    whose byte count is a frame of another row stride (a dense frame, say) is refused, naming both."""
    stride = nv12_row_stride(spec)
    n, h, w, _ = model_hw(spec)
    rows = n * h * 3 // 2
    if data.size == rt_byte_size(spec) or data.size % rows or data.size // rows < w:
        return
    raise InvalidInput(
        f"input '{spec.name}' (nv12, {w}x{h}) has rows {data.size // rows} bytes apart; the model's nv12 row "
        f"stride is {stride} bytes (aligned for its march): give {rt_byte_size(spec)} bytes (alignedByteSize), "
        f"each row padded to {stride}")


def _check(data: np.ndarray, spec: model_pb2.InputSpec, dtype: str) -> np.ndarray:
    data = np.asarray(data)
    want = np.dtype(dtype)
    if data.dtype != want:
        raise InvalidInput(
            f"input '{spec.name}' ({spec.input_type_rt}) must be {want.name}, got {data.dtype.name}",
            hint=f"expected validShape {list(rt_shape(spec))}, {rt_byte_size(spec)} bytes",
        )
    size = rt_byte_size(spec) // want.itemsize
    if spec.row_stride and spec.input_type_rt == "nv12":
        _check_nv12_stride(data, spec)
    if data.size != size:
        raise InvalidInput(
            f"input '{spec.name}' ({spec.input_type_rt}) needs {rt_byte_size(spec)} bytes "
            f"(validShape {list(rt_shape(spec))}), got {data.nbytes} (shape {list(data.shape)})"
        )
    if data.ndim > 1 and spec.input_type_rt != "nv12" and tuple(data.shape) != rt_shape(spec):
        raise InvalidInput(
            f"input '{spec.name}' has shape {list(data.shape)}, expected validShape "
            f"{list(rt_shape(spec))} ({spec.input_layout_rt or spec.input_type_rt})"
        )
    return data


def _image(data: np.ndarray, spec: model_pb2.InputSpec) -> np.ndarray:
    data = _check(data, spec, "uint8").reshape(rt_shape(spec))
    return relayout(minus_128(data), spec.input_layout_rt, spec.model_layout)


def _nv12(data: np.ndarray, spec: model_pb2.InputSpec) -> np.ndarray:
    data = _check(data, spec, "uint8").reshape(-1)
    n, h, w, _ = model_hw(spec)
    stride = nv12_row_stride(spec)
    frame = h * stride * 3 // 2
    out = np.empty((n, h, w, 3), dtype=np.uint8)
    for i in range(n):
        f = data[i * frame : (i + 1) * frame]
        out[i, :, :, 0] = f[: h * stride].reshape(h, stride)[:, :w]
        uv = f[h * stride :].reshape(h // 2, stride)[:, :w].reshape(h // 2, w // 2, 2)
        # Chroma upsampling by 2x2 replication, as the image pipeline does.
        out[i, :, :, 1:] = uv.repeat(2, axis=0).repeat(2, axis=1)
    return relayout(minus_128(out), "NHWC", spec.model_layout)


def _featuremap(data: np.ndarray, spec: model_pb2.InputSpec) -> np.ndarray:
    data = _check(data, spec, spec.model_dtype or "float32")
    return np.ascontiguousarray(data.reshape(tuple(spec.model_shape)))


#: input_type_rt -> converter(data, spec) -> quantized-model input
CONVERTERS: Dict[str, Callable[[np.ndarray, model_pb2.InputSpec], np.ndarray]] = {
    "nv12": _nv12,
    "yuv444": _image,
    "rgb": _image,
    "bgr": _image,
    "gray": _image,
    "featuremap": _featuremap,
}


#: input_type_rt whose Preprocess can be compiled into the first BPU subgraph (a transpose and
#: the -128 shift folded into its DequantizeLinear zero point); nv12's chroma upsampling stays here.
FUSABLE_RT_TYPES = ("yuv444", "rgb", "bgr", "gray")


def checked_rt_input(data: np.ndarray, spec: model_pb2.InputSpec) -> np.ndarray:
    """``data`` checked as the input_type_rt data of ``spec`` (uint8, validShape), as a view: no copy."""
    return _check(data, spec, "uint8").reshape(rt_shape(spec))


def preprocess_output_type(spec: model_pb2.InputSpec, fused: bool) -> tuple:
    """(dtype, shape) of what a Preprocess step writes: the model input, or the rt data when fused."""
    if fused:
        return np.dtype("uint8"), tuple(rt_shape(spec))
    return np.dtype(spec.model_dtype or "float32"), tuple(spec.model_shape)


def to_model_input(data: np.ndarray, spec: model_pb2.InputSpec) -> np.ndarray:
    """Convert one input from input_type_rt form to the quantized model's input."""
    try:
        convert = CONVERTERS[spec.input_type_rt]
    except KeyError:
        raise InvalidInput(f"input '{spec.name}': unknown input_type_rt '{spec.input_type_rt}'") from None
    return convert(data, spec)


# --- the inverse direction, for making inputs -----------------------------

def check_space(space: str) -> str:
    """``space`` if it is an input_space_and_range value ('' means regular)."""
    space = space or "regular"
    if space not in SPACES:
        raise InvalidInput(f"unknown input_space_and_range '{space}' (known: {', '.join(SPACES)})")
    return space


def yuv_to_rgb_affine(space: str = "regular"):
    """(M, c) with rgb = M @ yuv + c, per pixel, on 0..255 values of the given BT.601 range."""
    if check_space(space) == "regular":
        return _YUV2RGB.copy(), -_YUV2RGB @ _CHROMA
    m = _YUV2RGB / _VIDEO_SCALE  # scales the columns: undo the range compression first
    return m, -m @ _VIDEO_OFFSET


def yuv_range_affine(src: str, dst: str):
    """(M, c) with yuv_dst = M @ yuv_src + c: between the full and the video range (identity if equal)."""
    src, dst = check_space(src), check_space(dst)
    if src == dst:
        return np.eye(3), np.zeros(3)
    if src == "regular":  # full -> video
        return np.diag(_VIDEO_SCALE), _VIDEO_OFFSET - _VIDEO_SCALE * _CHROMA
    return np.diag(1.0 / _VIDEO_SCALE), _CHROMA - _VIDEO_OFFSET / _VIDEO_SCALE


def rgb_to_nv12(rgb: np.ndarray, space: str = "regular") -> np.ndarray:
    """An HxWx3 uint8 RGB image -> nv12 bytes (BT.601 in ``space``, 2x2 chroma mean)."""
    return yuv444_to_nv12(rgb_to_yuv444(rgb, space))


def nv12_rows_at_stride(frame: np.ndarray, h: int, w: int, stride: int) -> np.ndarray:
    """A dense nv12 frame (H*W*3/2 bytes) with each row of its Y and UV planes padded (zeros) to ``stride``
    bytes: what a J6 model's nv12 input takes (its tensor properties' stride and alignedByteSize)."""
    if stride == w:
        return frame
    rows = np.asarray(frame, dtype=np.uint8).reshape(h * 3 // 2, w)
    out = np.zeros((h * 3 // 2, stride), dtype=np.uint8)
    out[:, :w] = rows
    return out.reshape(-1)


def yuv444_to_nv12(yuv: np.ndarray) -> np.ndarray:
    """An HxWx3 uint8 YUV444 image -> nv12 bytes (2x2 chroma mean)."""
    h, w = yuv.shape[:2]
    uv = yuv[..., 1:].astype(np.float32).reshape(h // 2, 2, w // 2, 2, 2).mean(axis=(1, 3))
    return np.concatenate([yuv[..., 0].reshape(-1), np.clip(np.rint(uv), 0, 255).astype(np.uint8).reshape(-1)])


#: Seed of the random inputs every tool feeds when given none, so that two tools
#: (or a board and the simulator) given no inputs run the same data.
RANDOM_SEED = 0


def random_rt_input(spec: model_pb2.InputSpec, rng: np.random.Generator) -> np.ndarray:
    """A random input in input_type_rt form: uint8 images, standard-normal featuremaps."""
    if spec.input_type_rt == "featuremap":
        return rng.standard_normal(tuple(spec.model_shape)).astype(spec.model_dtype or "float32")
    if spec.input_type_rt == "nv12":
        return rng.integers(0, 256, rt_byte_size(spec), dtype=np.uint8)
    return rng.integers(0, 256, rt_shape(spec), dtype=np.uint8)


def random_rt_inputs(specs: Sequence[model_pb2.InputSpec], seed: int = RANDOM_SEED) -> List[np.ndarray]:
    """One random input per spec, in model input order (what infer, perf and hb_verifier use without inputs)."""
    rng = np.random.default_rng(seed)
    return [random_rt_input(s, rng) for s in specs]


def rgb_to_yuv444(rgb: np.ndarray, space: str = "regular") -> np.ndarray:
    """HxWx3 uint8 RGB -> HxWx3 uint8 YUV444 (BT.601, full range or ``bt601_video``)."""
    yuv = rgb.astype(np.float32) @ _RGB2YUV.T.astype(np.float32) + _CHROMA.astype(np.float32)
    return full_to_space(yuv, space)


def full_to_space(yuv: np.ndarray, space: str = "regular") -> np.ndarray:
    """Full-range YUV values (float or uint8, channels last) -> uint8 YUV in ``space``."""
    m, c = yuv_range_affine("regular", space)
    out = yuv.astype(np.float32) @ m.T.astype(np.float32) + c.astype(np.float32)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def image_to_rt(rgb: np.ndarray, spec: model_pb2.InputSpec) -> np.ndarray:
    """An HxWx3 uint8 RGB image (already at the model's H and W) -> input_type_rt form."""
    n, h, w, _ = model_hw(spec)
    if rgb.shape[:2] != (h, w):
        raise InvalidInput(f"image is {rgb.shape[1]}x{rgb.shape[0]}, input '{spec.name}' needs {w}x{h}")
    t, space = spec.input_type_rt, spec.input_space_and_range
    if t == "nv12":
        return np.tile(nv12_rows_at_stride(rgb_to_nv12(rgb, space), h, w, nv12_row_stride(spec)), n)
    if t == "rgb":
        hwc = rgb
    elif t == "bgr":
        hwc = rgb[..., ::-1]
    elif t == "yuv444":
        hwc = rgb_to_yuv444(rgb, space)
    elif t == "gray":
        hwc = rgb_to_yuv444(rgb)[..., :1]
    else:
        raise InvalidInput(f"input '{spec.name}' is a {t}; give it a .bin/.npy file, not an image")
    nhwc = np.ascontiguousarray(np.broadcast_to(hwc, (n,) + hwc.shape))
    return relayout(nhwc, "NHWC", spec.input_layout_rt or "NHWC")
