"""input_type_rt conversions, checked against conversions written out by hand."""
import numpy as np
import pytest

from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import (
    CONVERTERS,
    INPUT_TYPES_RT,
    INTERMEDIATE_TYPE,
    minus_128,
    random_rt_input,
    image_to_rt,
    relayout,
    rgb_to_nv12,
    rgb_to_yuv444,
    rt_byte_size,
    rt_shape,
    to_model_input,
)
from bpuemu.common.proto import model_pb2

H, W = 4, 6


def spec(input_type_rt, input_layout_rt="NHWC", model_layout="NCHW", n=1, c=3, h=H, w=W, dtype=None):
    if input_type_rt == "gray":
        c = 1
    shape = [n, c, h, w] if model_layout == "NCHW" else [n, h, w, c]
    return model_pb2.InputSpec(
        name="data",
        input_type_rt=input_type_rt,
        input_layout_rt="" if input_type_rt in ("nv12", "featuremap") else input_layout_rt,
        model_layout=model_layout,
        model_dtype=dtype or ("float32" if input_type_rt == "featuremap" else "int8"),
        model_shape=shape,
        plan_tensor="data",
    )


def test_registry_covers_every_input_type():
    assert set(CONVERTERS) == set(INPUT_TYPES_RT) == set(INTERMEDIATE_TYPE)
    assert INTERMEDIATE_TYPE["nv12"] == INTERMEDIATE_TYPE["yuv444"] == "yuv444_128"
    assert INTERMEDIATE_TYPE["rgb"] == "RGB_128" and INTERMEDIATE_TYPE["bgr"] == "BGR_128"
    assert INTERMEDIATE_TYPE["gray"] == "GRAY_128" and INTERMEDIATE_TYPE["featuremap"] == "featuremap"


def test_minus_128_on_every_byte():
    x = np.arange(256, dtype=np.uint8).reshape(16, 16)
    y = minus_128(x)
    assert y.dtype == np.int8 and y.shape == (16, 16)
    assert np.array_equal(y.astype(np.int16), x.astype(np.int16) - 128)


def test_relayout(rng):
    x = rng.integers(0, 9, (2, 3, 4, 5)).astype(np.int8)
    nhwc = relayout(x, "NCHW", "NHWC")
    assert nhwc.shape == (2, 4, 5, 3) and nhwc.flags.c_contiguous
    assert np.array_equal(nhwc, np.transpose(x, (0, 2, 3, 1)))
    back = relayout(nhwc, "NHWC", "NCHW")
    assert back.flags.c_contiguous and np.array_equal(back, x)
    assert relayout(x, "NCHW", "NCHW") is x
    assert relayout(x, "", "NHWC") is x


@pytest.mark.parametrize(
    "s, shape, nbytes",
    [
        (spec("rgb", "NHWC"), (1, H, W, 3), H * W * 3),
        (spec("rgb", "NCHW"), (1, 3, H, W), H * W * 3),
        (spec("bgr", "NHWC", model_layout="NHWC"), (1, H, W, 3), H * W * 3),
        (spec("yuv444", "NCHW", n=2), (2, 3, H, W), 2 * H * W * 3),
        (spec("gray", "NHWC"), (1, H, W, 1), H * W),
        (spec("gray", "NCHW"), (1, 1, H, W), H * W),
        (spec("nv12"), (1, 3, H, W), H * W * 3 // 2),
        (spec("nv12", n=2, model_layout="NHWC"), (2, 3, H, W), 2 * H * W * 3 // 2),
        (spec("featuremap"), (1, 3, H, W), H * W * 3 * 4),
        (spec("featuremap", dtype="int8"), (1, 3, H, W), H * W * 3),
        (spec("featuremap", dtype="float16"), (1, 3, H, W), H * W * 3 * 2),
        (model_pb2.InputSpec(name="v", input_type_rt="featuremap", model_dtype="float32", model_shape=[2, 16]), (2, 16), 128),
        (model_pb2.InputSpec(name="s", input_type_rt="featuremap", model_dtype="int64", model_shape=[5]), (5,), 40),
    ],
    ids=lambda v: None if isinstance(v, model_pb2.InputSpec) else str(v),
)
def test_rt_shape_and_byte_size(s, shape, nbytes):
    assert rt_shape(s) == shape
    assert rt_byte_size(s) == nbytes


@pytest.mark.parametrize("kind", ["rgb", "bgr", "yuv444"])
@pytest.mark.parametrize("layout_rt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("model_layout", ["NCHW", "NHWC"])
def test_image_conversion(kind, layout_rt, model_layout, rng):
    s = spec(kind, layout_rt, model_layout, n=2)
    img = rng.integers(0, 256, rt_shape(s), dtype=np.uint8)
    out = to_model_input(img, s)
    assert out.dtype == np.int8 and out.shape == tuple(s.model_shape)
    # By hand: minus 128, then move channels where the model wants them.
    x = img.astype(np.int16) - 128
    if layout_rt != model_layout:
        x = x.transpose((0, 3, 1, 2) if model_layout == "NCHW" else (0, 2, 3, 1))
    assert np.array_equal(out, x.astype(np.int8))


def test_gray_conversion(rng):
    s = spec("gray", "NHWC")
    img = rng.integers(0, 256, (1, H, W, 1), dtype=np.uint8)
    out = to_model_input(img, s)
    assert out.shape == (1, 1, H, W)
    assert np.array_equal(out[0, 0].astype(np.int16), img[0, :, :, 0].astype(np.int16) - 128)


def test_flat_bytes_are_accepted_for_images(rng):
    s = spec("rgb", "NHWC")
    img = rng.integers(0, 256, rt_shape(s), dtype=np.uint8)
    assert np.array_equal(to_model_input(img.reshape(-1), s), to_model_input(img, s))


def _nv12_by_hand(frame: np.ndarray, h: int, w: int) -> np.ndarray:
    """yuv444 (H, W, 3) uint8 from one nv12 frame, pixel by pixel."""
    y = frame[: h * w].reshape(h, w)
    uv = frame[h * w :]
    out = np.empty((h, w, 3), dtype=np.uint8)
    for i in range(h):
        for j in range(w):
            k = (i // 2) * (w // 2) + (j // 2)
            out[i, j] = (y[i, j], uv[2 * k], uv[2 * k + 1])
    return out


@pytest.mark.parametrize("model_layout", ["NCHW", "NHWC"])
def test_nv12_conversion(model_layout, rng):
    s = spec("nv12", model_layout=model_layout, n=2)
    data = rng.integers(0, 256, rt_byte_size(s), dtype=np.uint8)
    out = to_model_input(data, s)
    frame = H * W * 3 // 2
    expected = np.stack([_nv12_by_hand(data[i * frame:(i + 1) * frame], H, W) for i in range(2)])
    expected = (expected.astype(np.int16) - 128).astype(np.int8)
    if model_layout == "NCHW":
        expected = expected.transpose(0, 3, 1, 2)
    assert out.dtype == np.int8 and out.shape == tuple(s.model_shape)
    assert np.array_equal(out, expected)


def test_featuremap_passes_through(rng):
    s = spec("featuremap")
    x = rng.standard_normal((1, 3, H, W)).astype(np.float32)
    out = to_model_input(x, s)
    assert out.dtype == np.float32 and np.array_equal(out, x)
    assert np.array_equal(to_model_input(x.reshape(-1), s), x)


def test_featuremap_of_rank_2(rng):
    s = model_pb2.InputSpec(name="v", input_type_rt="featuremap", model_dtype="float32", model_shape=[2, 16])
    x = rng.standard_normal((2, 16)).astype(np.float32)
    assert np.array_equal(to_model_input(x, s), x)
    assert random_rt_input(s, rng).shape == (2, 16)
    with pytest.raises(InvalidInput, match=r"expected validShape \[2, 16\]"):
        to_model_input(x.reshape(4, 8), s)


def test_featuremap_of_another_dtype(rng):
    s = spec("featuremap", dtype="int8")
    x = rng.integers(-128, 128, (1, 3, H, W)).astype(np.int8)
    assert np.array_equal(to_model_input(x, s), x)


# --- refusals ----------------------------------------------------------------------

def test_wrong_dtype_names_expected_properties():
    s = spec("rgb", "NHWC")
    with pytest.raises(InvalidInput) as exc:
        to_model_input(np.zeros(rt_shape(s), np.float32), s)
    text = str(exc.value)
    assert "must be uint8, got float32" in text
    assert f"validShape {list(rt_shape(s))}" in text and f"{rt_byte_size(s)} bytes" in text


def test_wrong_size_names_expected_properties():
    s = spec("nv12")
    with pytest.raises(InvalidInput) as exc:
        to_model_input(np.zeros(H * W * 3, np.uint8), s)
    msg = exc.value.message
    assert f"needs {H * W * 3 // 2} bytes" in msg and f"validShape [1, 3, {H}, {W}]" in msg and "got 72" in msg


def test_wrong_shape_with_right_size():
    s = spec("rgb", "NHWC")
    with pytest.raises(InvalidInput) as exc:
        to_model_input(np.zeros((1, 3, H, W), np.uint8), s)
    assert f"expected validShape [1, {H}, {W}, 3]" in exc.value.message
    assert "NHWC" in exc.value.message


def test_featuremap_wrong_dtype():
    s = spec("featuremap")
    with pytest.raises(InvalidInput, match="must be float32, got float64"):
        to_model_input(np.zeros((1, 3, H, W)), s)


def test_unknown_input_type():
    s = spec("rgb")
    s.input_type_rt = "rgbp"
    with pytest.raises(InvalidInput, match="unknown input_type_rt 'rgbp'"):
        to_model_input(np.zeros(3, np.uint8), s)


# --- making inputs --------------------------------------------------------------------

@pytest.mark.parametrize(
    "color, yuv",
    [
        ((255, 255, 255), (255, 128, 128)),
        ((0, 0, 0), (0, 128, 128)),
        ((128, 128, 128), (128, 128, 128)),
        ((255, 0, 0), (76, 85, 255)),
        ((0, 255, 0), (150, 44, 21)),
        ((0, 0, 255), (29, 255, 107)),
    ],
)
def test_rgb_to_nv12_bt601_full_range(color, yuv):
    img = np.empty((H, W, 3), np.uint8)
    img[...] = color
    nv12 = rgb_to_nv12(img)
    assert nv12.dtype == np.uint8 and nv12.shape == (H * W * 3 // 2,)
    assert np.all(nv12[: H * W] == yuv[0])
    assert np.all(nv12[H * W :: 2] == yuv[1]) and np.all(nv12[H * W + 1 :: 2] == yuv[2])


@pytest.mark.parametrize(
    "color, yuv",
    [((255, 255, 255), (255, 128, 128)), ((255, 0, 0), (76, 85, 255)), ((0, 0, 255), (29, 255, 107))],
)
def test_rgb_to_yuv444(color, yuv):
    img = np.empty((H, W, 3), np.uint8)
    img[...] = color
    out = rgb_to_yuv444(img)
    assert out.dtype == np.uint8 and out.shape == (H, W, 3)
    assert np.all(out == np.array(yuv, np.uint8))


def test_rgb_to_nv12_chroma_is_the_2x2_mean():
    img = np.zeros((2, 2, 3), np.uint8)
    img[0, 0] = (255, 0, 0)  # one red pixel in an otherwise black block
    nv12 = rgb_to_nv12(img)
    assert list(nv12[:4]) == [76, 0, 0, 0]
    # U: (85 + 3 * 128) / 4 = 117.25; V: (255 + 3 * 128) / 4 = 159.75
    assert list(nv12[4:]) == [117, 160]


def test_gray_image_through_nv12_has_no_chroma():
    img = np.full((H, W, 3), 200, np.uint8)
    out = to_model_input(rgb_to_nv12(img), spec("nv12"))
    assert np.all(out[0, 0] == 200 - 128) and np.all(out[0, 1:] == 0)


@pytest.mark.parametrize("kind", INPUT_TYPES_RT)
def test_random_rt_input_is_a_valid_input(kind):
    s = spec(kind, "NHWC")
    a = random_rt_input(s, np.random.default_rng(7))
    b = random_rt_input(s, np.random.default_rng(7))
    assert np.array_equal(a, b)
    assert a.nbytes == rt_byte_size(s)
    if kind == "featuremap":
        assert a.dtype == np.float32 and a.shape == tuple(s.model_shape)
    elif kind == "nv12":
        assert a.dtype == np.uint8 and a.ndim == 1
    else:
        assert a.dtype == np.uint8 and a.shape == rt_shape(s)
    out = to_model_input(a, s)
    assert out.shape == tuple(s.model_shape)


# --- images -> input_type_rt ---------------------------------------------------------

@pytest.mark.parametrize("kind", ["rgb", "bgr", "yuv444", "gray", "nv12"])
@pytest.mark.parametrize("layout_rt", ["NHWC", "NCHW"])
def test_image_to_rt(kind, layout_rt, rng):
    s = spec(kind, layout_rt, n=2)
    img = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    rt = image_to_rt(img, s)
    assert rt.dtype == np.uint8 and rt.nbytes == rt_byte_size(s)
    if kind == "nv12":
        assert np.array_equal(rt, np.concatenate([rgb_to_nv12(img)] * 2))
        return
    assert rt.shape == rt_shape(s)
    hwc = {"rgb": img, "bgr": img[..., ::-1], "yuv444": rgb_to_yuv444(img), "gray": rgb_to_yuv444(img)[..., :1]}[kind]
    for i in range(2):
        frame = rt[i] if layout_rt == "NHWC" else rt[i].transpose(1, 2, 0)
        assert np.array_equal(frame, hwc)
    to_model_input(rt, s)  # and the runtime accepts it


def test_image_to_rt_refusals(rng):
    img = rng.integers(0, 256, (H, W + 2, 3), dtype=np.uint8)
    with pytest.raises(InvalidInput, match=f"image is {W + 2}x{H}, input 'data' needs {W}x{H}"):
        image_to_rt(img, spec("rgb"))
    with pytest.raises(InvalidInput, match="featuremap"):
        image_to_rt(img[:, :W], spec("featuremap"))
