"""input_space_and_range: bt601_video, from the yaml to the board.

The colour equations here are written out independently of bpuemu (the
published BT.601 studio-swing coefficients), so a wrong matrix in
bpuemu.common.input_types cannot agree with itself. A makertbin run with
nv12 input in each range converts an identity 1x1 conv "model of colours";
the video-range model must turn video-range nv12 bytes back into the RGB
they encode, the regular model must decode the same bytes with the
full-range equations, and quanti.onnx, the x86 simulator and a real
hrt_boardd on loopback must agree bit-exactly on those bytes.
"""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bpuemu.board.runtime import Runtime
from bpuemu.common.input_types import rgb_to_yuv444, to_model_input, yuv_to_rgb_affine
from bpuemu.host import HB_ONNXRuntime
from bpuemu.host.mapper.makertbin import makertbin_from_config
from bpuemu.host.verifier.core import VerifyOptions, verify

from makertbin_helpers import write_cal_dir, write_config
from sshd_harness import Daemon

SIZE = 8
#: Known colours (RGB), one 2x2 block each so that nv12 chroma subsampling is exact.
COLOURS = np.array([[0, 0, 0], [255, 255, 255], [255, 0, 0], [0, 255, 0], [0, 0, 255], [128, 128, 128],
                    [255, 255, 0], [0, 255, 255], [255, 0, 255], [64, 160, 32], [200, 100, 50], [30, 60, 90],
                    [90, 200, 220], [240, 20, 120], [10, 10, 10], [245, 245, 245]], np.float64)


# --- BT.601, written out independently ---------------------------------------------------

def video_yuv(rgb):
    """R'G'B' in [0, 1] -> Y in [16, 235], Cb/Cr in [16, 240] (ITU-R BT.601 studio swing)."""
    r, g, b = (rgb[..., i] / 255.0 for i in range(3))
    y = 16 + 65.481 * r + 128.553 * g + 24.966 * b
    cb = 128 - 37.797 * r - 74.203 * g + 112.0 * b
    cr = 128 + 112.0 * r - 93.786 * g - 18.214 * b
    return np.stack([y, cb, cr], axis=-1)


def rgb_from_video(yuv):
    y, cb, cr = (yuv[..., i] - o for i, o in enumerate((16.0, 128.0, 128.0)))
    return np.stack([1.164383 * y + 1.596027 * cr,
                     1.164383 * y - 0.391762 * cb - 0.812968 * cr,
                     1.164383 * y + 2.017232 * cb], axis=-1)


def rgb_from_full(yuv):
    y, cb, cr = yuv[..., 0], yuv[..., 1] - 128.0, yuv[..., 2] - 128.0
    return np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], axis=-1)


def colour_frame():
    """(yuv444 HxWx3 uint8 in video range, its nv12 bytes): the 16 colours as 2x2 blocks."""
    yuv = np.rint(video_yuv(COLOURS)).astype(np.uint8).reshape(4, 4, 3)
    full = yuv.repeat(2, axis=0).repeat(2, axis=1)
    uv = yuv[..., 1:]  # one chroma sample per 2x2 block: exactly the block's value
    return full, np.concatenate([full[..., 0].reshape(-1), uv.reshape(-1)])


# --- the equations in bpuemu ---------------------------------------------------------------

def test_video_range_equations_match_bt601():
    yuv = video_yuv(COLOURS)
    m, c = yuv_to_rgb_affine("bt601_video")
    assert np.allclose(yuv @ m.T + c, rgb_from_video(yuv), atol=1e-3)
    assert np.allclose(yuv @ m.T + c, COLOURS, atol=0.05)
    m, c = yuv_to_rgb_affine("regular")
    assert np.allclose(yuv @ m.T + c, rgb_from_full(yuv), atol=1e-3)
    encoded = rgb_to_yuv444(COLOURS.astype(np.uint8)[None], "bt601_video")[0].astype(int)
    assert np.abs(encoded - np.rint(video_yuv(COLOURS))).max() <= 1
    assert encoded[:, 0].min() >= 16 and encoded[:, 0].max() <= 235
    assert encoded[:, 1:].min() >= 16 and encoded[:, 1:].max() <= 240


def test_a_yuv444_trained_model_gets_video_range_yuv_expanded_to_full_range():
    from bpuemu.host.convert.preprocess import colour_matrix

    yuv = video_yuv(COLOURS)
    m, c = colour_matrix("yuv444", "yuv444", "bt601_video")
    full = np.stack([(yuv[:, 0] - 16) * 255 / 219, (yuv[:, 1] - 128) * 255 / 224 + 128,
                     (yuv[:, 2] - 128) * 255 / 224 + 128], axis=-1)
    assert np.allclose(yuv @ m.T + c, full, atol=1e-6)
    m, c = colour_matrix("nv12", "yuv444", "regular")
    assert np.allclose(m, np.eye(3)) and np.allclose(c, 0)
    # and calibration data (full-range YUV) is compressed into the video range the board will see
    from bpuemu.common.proto import model_pb2
    from bpuemu.host.convert.caldata import to_model_inputs

    spec = model_pb2.InputSpec(name="data", input_type_rt="yuv444", input_layout_rt="NHWC",
                               input_space_and_range="bt601_video", model_layout="NHWC", model_dtype="int8",
                               model_shape=[1, 1, 1, 3], plan_tensor="data")
    sample = np.array([0, 128, 255], np.uint8).reshape(1, 1, 1, 3)
    feed = to_model_inputs({"data": sample}, [spec], {"data": ("yuv444", "NHWC")})["data"]
    assert feed.reshape(-1).tolist() == [16 - 128, 128 - 128, 240 - 128]


# --- makertbin, both ranges ----------------------------------------------------------------

def _colour_model(path):
    """The float model: an identity 1x1 conv on RGB NCHW (its output is the colour it was given)."""
    w = np.eye(3, dtype=np.float32)[:, :, None, None]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["data", "w", "b"], ["rgb"], name="colour", kernel_shape=[1, 1])], "colours",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("rgb", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(3, np.float32), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{space: (bin, quanti.onnx, original_float_model.onnx)} for nv12 input in both ranges."""
    tmp = tmp_path_factory.mktemp("bt601")
    onnx_path = str(tmp / "float.onnx")
    _colour_model(onnx_path)
    rng = np.random.default_rng(0)
    cal = write_cal_dir(str(tmp / "cal"), [rng.integers(0, 256, (1, 3, SIZE, SIZE), dtype=np.uint8) for _ in range(4)])
    out = {}
    for space in ("regular", "bt601_video"):
        inp = {"input_type_train": "rgb", "input_layout_train": "NCHW", "input_type_rt": "nv12",
               "input_space_and_range": space, "norm_type": "no_preprocess", "input_shape": f"1x3x{SIZE}x{SIZE}",
               "cal_data_dir": cal, "cal_data_type": "uint8"}
        cfg = write_config(str(tmp / f"{space}.yaml"), onnx_path, space, str(tmp / space), {"data": inp},
                           calibration={"calibration_type": "max"})
        art = makertbin_from_config(cfg)
        out[space] = (art.bin, art.quantized, art.original)
    return out


def _loaded(bin_path):
    """The .bin's model in the x86 simulator, and its input spec."""
    rt = Runtime()
    rt.load(bin_path)
    m = rt.model()
    return m, m.model.input_specs[0]


@pytest.mark.parametrize("space,decode", [("bt601_video", rgb_from_video), ("regular", rgb_from_full)])
def test_hzpreprocess_decodes_with_the_range_equations(converted, space, decode):
    """original_float_model.onnx (HzPreprocess + the float model) on yuv444_128 gives the range's RGB."""
    yuv, _ = colour_frame()
    x = (yuv.astype(np.int16) - 128).astype(np.float32)[None]  # yuv444_128, NHWC (the nv12 model layout)
    sess = ort.InferenceSession(converted[space][2], providers=["CPUExecutionProvider"])
    got = sess.run(None, {"data": x})[0][0].transpose(1, 2, 0)
    assert np.allclose(got, decode(yuv.astype(np.float64)), atol=0.02)


def test_board_decodes_video_range_nv12_into_the_colours_it_encodes(converted):
    yuv, nv12 = colour_frame()
    results = {}
    for space in ("bt601_video", "regular"):
        m, _ = _loaded(converted[space][0])
        results[space] = m.run([nv12])[0][0].transpose(1, 2, 0).astype(np.float64)
    blocks = COLOURS.reshape(4, 4, 3).repeat(2, axis=0).repeat(2, axis=1)
    step = 255.0 / 127  # about one int8 step of a 0..255 output
    assert np.abs(results["bt601_video"] - blocks).max() <= 2.5 * step
    full = rgb_from_full(yuv.astype(np.float64))
    inside = (full > 0) & (full < 255)  # the regular model's output saturates outside its calibrated range
    assert np.abs(results["regular"] - full)[inside].max() <= 2.5 * step
    # The same bytes are different colours in the two ranges: video black is (16,16,16) read as full range.
    assert np.abs(results["bt601_video"] - results["regular"]).max() > 12
    black = results["regular"][0, 0]
    assert np.all(np.abs(black - 16) <= 2.5 * step), black


def test_bin_carries_the_range_and_images_are_encoded_in_it(converted):
    from bpuemu.common.input_types import image_to_rt

    for space in ("bt601_video", "regular"):
        _, spec = _loaded(converted[space][0])
        assert spec.input_space_and_range == space
    _, spec = _loaded(converted["bt601_video"][0])
    white = np.full((SIZE, SIZE, 3), 255, np.uint8)
    nv12 = image_to_rt(white, spec)
    assert nv12[: SIZE * SIZE].max() == 235 and set(nv12[SIZE * SIZE:]) == {128}


def test_board_simulator_and_quanti_onnx_agree_bit_exactly_on_video_range_input(converted, tmp_path):
    _, nv12 = colour_frame()
    rng = np.random.default_rng(5)
    frames = [nv12, np.concatenate([rng.integers(16, 236, SIZE * SIZE), rng.integers(16, 241, SIZE * SIZE // 2)])]
    daemon = Daemon(tmp_path / "boardd").start()
    try:
        for i, frame in enumerate(frames):
            raw = tmp_path / f"frame{i}.bin"
            frame.astype(np.uint8).tofile(raw)
            bin_path, quanti, _ = converted["bt601_video"]
            report = verify(VerifyOptions(bin_model=bin_path, quanti_model=quanti, run_sim=True,
                                          boards=[daemon.target], input_files=f"data:{raw}"))
            assert report.passed
            assert len(report.pairs) == 3
            for pair in report.pairs:
                assert all(o.max_abs_error == 0 for o in pair.outputs), pair.source
            # and the board's Preprocess made exactly quanti.onnx's input
            m, spec = _loaded(bin_path)
            ref = HB_ONNXRuntime(quanti).run(None, {"data": to_model_input(frame.astype(np.uint8), spec)})[0]
            assert np.array_equal(m.run([frame.astype(np.uint8)])[0], ref)
    finally:
        assert daemon.stop() == 0, daemon.log()
