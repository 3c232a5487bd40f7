"""HzPreprocess insertion, the optimizer, and the calibration-data reader."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import rt_shape, to_model_input
from bpuemu.host.convert.caldata import CalInput, iter_samples, read_sample, to_model_inputs
from bpuemu.host.convert.optimizer import fuse_hardswish, optimize
from bpuemu.host.convert.preprocess import InputPreprocess, affine, colour_matrix, insert_preprocess
from bpuemu.host.convert.pipeline import JobInput, input_spec


def _identity_model(shape, opset=13):
    g = helper.make_graph([helper.make_node("Identity", ["data"], ["y"], name="id")], "t",
                          [helper.make_tensor_value_info("data", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _run(model, feed):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


@pytest.mark.parametrize("rt,train", [("rgb", "rgb"), ("bgr", "rgb"), ("rgb", "bgr"), ("yuv444", "yuv444")])
def test_hzpreprocess_applies_mean_and_scale(rt, train):
    mean, scale = (10.0, 20.0, 30.0), (0.5, 0.25, 2.0)
    m = insert_preprocess(_identity_model([1, 3, 4, 4]), [InputPreprocess("data", rt, train, "NCHW", mean, scale)])
    x = np.random.default_rng(0).integers(-128, 128, (1, 3, 4, 4)).astype(np.float32)
    y = _run(m, {"data": x})
    v = x + 128  # the image as the camera gave it, in rt colour order
    if rt != train:
        v = v[:, ::-1]
    expect = (v - np.array(mean)[None, :, None, None]) * np.array(scale)[None, :, None, None]
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-4)
    assert m.graph.node[0].name == "HzPreprocess" and m.graph.node[0].op_type == "Conv"


def test_hzpreprocess_nv12_takes_nhwc_and_converts_yuv_to_rgb():
    m = insert_preprocess(_identity_model([1, 3, 2, 2]), [InputPreprocess("data", "nv12", "rgb", "NCHW")])
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [1, 2, 2, 3]
    # a grey pixel (Y=100, U=V=128) is grey in RGB too
    x = np.full((1, 2, 2, 3), 0, np.float32)
    x[..., 0] = 100 - 128
    y = _run(m, {"data": x})
    np.testing.assert_allclose(y, np.full((1, 3, 2, 2), 100.0), atol=1e-3)


def test_hzpreprocess_nhwc_train_layout_uses_matmul():
    m = insert_preprocess(_identity_model([1, 4, 4, 3]), [InputPreprocess("data", "rgb", "rgb", "NHWC", (1.0,), (2.0,))])
    x = np.random.default_rng(1).integers(-128, 128, (1, 4, 4, 3)).astype(np.float32)
    np.testing.assert_allclose(_run(m, {"data": x}), (x + 128 - 1.0) * 2.0, rtol=1e-6)


def test_forbidden_type_combination_is_refused():
    with pytest.raises(InvalidInput, match="cannot feed input_type_train 'gray'"):
        colour_matrix("rgb", "gray")
    with pytest.raises(InvalidInput, match="needs 3 channel"):
        affine(InputPreprocess("data", "rgb", "rgb", "NCHW"), 1)


def _bn_model():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.random(4).astype(np.float32) + 0.5, "s"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "mu"),
             numpy_helper.from_array(rng.random(4).astype(np.float32) + 0.5, "var")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["bn"], name="bn"),
             helper.make_node("Relu", ["bn"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 7
    return m


def test_optimizer_folds_batchnorm_raises_opset_and_keeps_outputs():
    m = _bn_model()
    o = optimize(m)
    assert "BatchNormalization" not in [n.op_type for n in o.graph.node]
    assert next(op.version for op in o.opset_import if op.domain == "") >= 13
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(o, {"x": x}), _run(m, {"x": x}), rtol=1e-5, atol=1e-5)


def test_optimizer_fuses_paddle_hardswish():
    inits = [numpy_helper.from_array(np.array(3.0, np.float32), "three"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    nodes = [helper.make_node("Add", ["x", "three"], ["a"], name="add"),
             helper.make_node("Clip", ["a", "zero", "six"], ["c"], name="clip"),
             helper.make_node("Mul", ["x", "c"], ["m"], name="mul"),
             helper.make_node("Div", ["m", "six"], ["y"], name="div")]
    g = helper.make_graph(nodes, "hs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    o = optimize(m)
    assert [n.op_type for n in o.graph.node] == ["HardSwish"]
    x = np.linspace(-5, 5, 32, dtype=np.float32).reshape(1, 2, 4, 4)
    np.testing.assert_allclose(_run(o, {"x": x}), _run(m, {"x": x}), rtol=1e-6, atol=1e-6)
    assert fuse_hardswish(o) == 0  # nothing left to fuse


def test_optimizer_fuses_hardswishes_in_a_row():
    """PaddleOCR's models chain them: the second one is found after the first was fused."""
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("three", 3), ("zero", 0), ("six", 6))]
    nodes = []
    for k, (src, dst) in enumerate((("x", "h"), ("h", "y"))):
        nodes += [helper.make_node("Add", [src, "three"], [f"a{k}"], name=f"add{k}"),
                  helper.make_node("Clip", [f"a{k}", "zero", "six"], [f"c{k}"], name=f"clip{k}"),
                  helper.make_node("Mul", [src, f"c{k}"], [f"m{k}"], name=f"mul{k}"),
                  helper.make_node("Div", [f"m{k}", "six"], [dst], name=f"div{k}")]
    g = helper.make_graph(nodes, "hs2", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    o = optimize(m)
    assert [n.op_type for n in o.graph.node] == ["HardSwish", "HardSwish"]
    x = np.linspace(-5, 5, 32, dtype=np.float32).reshape(1, 2, 4, 4)
    np.testing.assert_allclose(_run(o, {"x": x}), _run(m, {"x": x}), rtol=1e-6, atol=1e-6)


def test_caldata_reads_raw_by_type_and_suffix_rule(tmp_path):
    f32 = tmp_path / "cal_f32"
    f32.mkdir()
    a = np.random.default_rng(0).random((1, 3, 4, 4)).astype(np.float32)
    a.tofile(f32 / "0.bin")
    ci = CalInput("data", str(f32), (1, 3, 4, 4))
    assert ci.resolved_dtype() == np.float32
    np.testing.assert_array_equal(read_sample(str(f32 / "0.bin"), ci), a)
    u8 = tmp_path / "cal"
    u8.mkdir()
    (a * 255).astype(np.uint8).tofile(u8 / "0.bin")
    assert CalInput("data", str(u8), (1, 3, 4, 4)).resolved_dtype() == np.uint8
    with pytest.raises(InvalidInput, match="needs 48"):
        read_sample(str(f32 / "0.bin"), CalInput("data", str(f32), (1, 3, 4, 4), dtype="uint8"))


def test_caldata_multi_input_pairs_by_order_and_checks_counts(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    for i in range(3):
        np.save(tmp_path / "a" / f"{i}.npy", np.full((1, 2), i, np.float32))
        np.save(tmp_path / "b" / f"{i}.npy", np.full((1, 2), 10 + i, np.float32))
    cis = [CalInput("a", str(tmp_path / "a"), (1, 2)), CalInput("b", str(tmp_path / "b"), (1, 2))]
    samples = list(iter_samples(cis))
    assert [(s["a"][0, 0], s["b"][0, 0]) for s in samples] == [(0, 10), (1, 11), (2, 12)]
    np.save(tmp_path / "b" / "3.npy", np.zeros((1, 2), np.float32))
    with pytest.raises(InvalidInput, match="different file counts"):
        list(iter_samples(cis))


@pytest.mark.parametrize("rt", ["rgb", "bgr", "yuv444", "nv12"])
def test_calibration_feed_equals_what_the_board_preprocess_makes(rt):
    """Calibration sees exactly the int8 tensor the board builds from the same picture."""
    ji = JobInput(InputPreprocess("data", rt, "rgb", "NCHW"), (1, 3, 4, 4), input_layout_rt="NHWC")
    spec = input_spec(ji)
    rgb_nchw = np.random.default_rng(3).integers(0, 256, (1, 3, 4, 4)).astype(np.float32)
    feed = to_model_inputs({"data": rgb_nchw}, [spec], {"data": ("rgb", "NCHW")})["data"]
    from bpuemu.common.input_types import image_to_rt

    board_view = to_model_input(image_to_rt(rgb_nchw[0].transpose(1, 2, 0).astype(np.uint8), spec), spec)
    if rt == "nv12":  # chroma means may round differently by one level; luma must match exactly
        assert np.array_equal(feed[..., 0], board_view[..., 0].astype(np.float32))
        assert np.abs(feed - board_view).max() <= 1
    else:
        np.testing.assert_array_equal(feed, board_view.astype(np.float32))
    assert list(feed.shape) == list(spec.model_shape)


@pytest.mark.parametrize("kind,channels", [("rgb", 3), ("bgr", 3), ("gray", 1)])
@pytest.mark.parametrize("train_layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("rt_layout", ["NCHW", "NHWC", ""])
def test_rt_data_of_the_same_type_is_the_sample_in_the_rt_layout(kind, channels, train_layout, rt_layout):
    """input_type_rt == input_type_train: the rt data is the sample's bytes, moved from the train layout to
    input_layout_rt (the train layout when unset) at most once; N = 2 and H != W, so a wrong axis shows."""
    from bpuemu.host.convert.caldata import train_to_rt

    ji = JobInput(InputPreprocess("data", kind, kind, train_layout), (2, channels, 5, 7) if train_layout == "NCHW"
                  else (2, 5, 7, channels), input_layout_rt=rt_layout)
    spec = input_spec(ji)
    nhwc = np.random.default_rng(5).integers(0, 256, (2, 5, 7, channels), dtype=np.uint8)
    sample = nhwc.transpose(0, 3, 1, 2) if train_layout == "NCHW" else nhwc
    got = train_to_rt(sample, kind, train_layout, spec)
    assert spec.input_layout_rt == (rt_layout or train_layout)
    expect = nhwc.transpose(0, 3, 1, 2) if spec.input_layout_rt == "NCHW" else nhwc
    assert got.dtype == np.uint8 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, expect)
    assert tuple(got.shape) == tuple(rt_shape(spec))


def test_optimizer_folds_scalar_and_per_channel_mul_add_into_conv():
    from bpuemu.host.convert.optimizer import fold_conv_mul_add

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1.7], np.float32), "k"),                       # Paddle's [1] scale
             numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "a")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "k"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "a"], ["y"], name="add")]
    g = helper.make_graph(nodes, "f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    folded = onnx.ModelProto.FromString(m.SerializeToString())
    assert fold_conv_mul_add(folded) == 2
    assert [n.op_type for n in folded.graph.node] == ["Conv"]
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(folded, {"x": x}), _run(m, {"x": x}), rtol=1e-5, atol=1e-5)
