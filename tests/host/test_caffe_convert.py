"""Caffe -> ONNX layer converters, checked against OpenCV's Caffe importer (an independent implementation).

Each net is written as a real prototxt + caffemodel pair; the converted ONNX
model runs in onnxruntime and OpenCV's cv2.dnn.readNetFromCaffe runs the same
files. The criterion: max |difference| <= 1e-4 of the output's value range.
"""
import numpy as np
import onnxruntime as ort
import pytest

from bpuemu.common.errors import InvalidInput
from bpuemu.host.caffe import UnsupportedLayers, caffe_inputs, caffe_to_onnx

from caffe_nets import CaffeNetBuilder, opencv_forward, relative_diff


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return names, sess.run(None, {sess.get_inputs()[0].name: x})


def _compare(tmp_path, b, x, tol=1e-4):
    proto, weights = b.write(str(tmp_path))
    model = caffe_to_onnx(proto, weights)
    names, ours = _run(model, x)
    theirs = opencv_forward(proto, weights, x, names)
    for name, a, r in zip(names, ours, theirs):
        assert a.size == r.size, (name, a.shape, r.shape)
        assert relative_diff(a, r) <= tol, (name, relative_diff(a, r))
    return model, names, ours


def _image(rng, shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def test_conv_bn_scale_relu_pool_ip_softmax(tmp_path, rng):
    """The classifier pattern: BatchNorm (+ moving-average factor) and Scale fold into one BatchNormalization."""
    b = CaffeNetBuilder()
    b.input("data", (1, 3, 17, 17))
    b.layer("conv1", "Convolution", "data", blobs=[b.randn(8, 3, 3, 3), b.randn(8)],
            convolution_param={"num_output": 8, "kernel_size": [3], "stride": [2], "pad": [1]})
    b.layer("bn1", "BatchNorm", "conv1", "conv1",
            blobs=[b.randn(8) * 5, np.abs(b.randn(8)) * 5 + 1, [5.0]], batch_norm_param={"eps": 1e-3})
    b.layer("scale1", "Scale", "conv1", "conv1", blobs=[b.randn(8) + 1, b.randn(8)], scale_param={"bias_term": True})
    b.layer("relu1", "ReLU", "conv1", "conv1")
    b.layer("pool1", "Pooling", "conv1", pooling_param={"pool": 0, "kernel_size": 3, "stride": 2})  # ceil: 9 -> 4
    b.layer("fc", "InnerProduct", "pool1", blobs=[b.randn(5, 8 * 4 * 4), b.randn(5)], inner_product_param={"num_output": 5})
    b.layer("prob", "Softmax", "fc")
    model, names, outs = _compare(tmp_path, b, _image(rng, (1, 3, 17, 17)))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("BatchNormalization") == 1 and "Mul" not in ops  # Scale folded into the BN
    assert [n.name for n in model.graph.node if n.op_type == "Conv"] == ["conv1"]
    assert names == ["prob"] and outs[0].shape == (1, 5)


def test_batch_norm_output_read_after_its_scale_is_not_folded(tmp_path, rng):
    b = CaffeNetBuilder()
    b.input("data", (1, 3, 5, 5))
    b.layer("bn", "BatchNorm", "data", blobs=[b.randn(3), np.abs(b.randn(3)) + 0.5, [1.0]])
    b.layer("scale", "Scale", "bn", blobs=[b.randn(3) + 2, b.randn(3)], scale_param={"bias_term": True})
    b.layer("sum", "Eltwise", ["bn", "scale"])  # reads the plain BatchNorm output too
    model, _, _ = _compare(tmp_path, b, _image(rng, (1, 3, 5, 5)))
    assert [n.op_type for n in model.graph.node] == ["BatchNormalization", "Mul", "Add", "Add"]


@pytest.mark.parametrize("pool,pad,kernel,stride,size", [
    (1, 0, 3, 2, 10),   # AVE, ceil overhang, no pad: the window is clipped to the input
    (1, 1, 3, 2, 10),   # AVE with pad and overhang: the divisor counts the pad, not the overhang
    (1, 1, 3, 2, 9),    # AVE with pad, no overhang
    (0, 1, 2, 2, 9),    # MAX with pad: the last window would start in the padding and is dropped
    (0, 0, 3, 3, 11),
])
def test_pooling_rounds_like_caffe(tmp_path, rng, pool, pad, kernel, stride, size):
    b = CaffeNetBuilder()
    b.input("data", (1, 2, size, size))
    b.layer("pool", "Pooling", "data", pooling_param={"pool": pool, "pad": pad, "kernel_size": kernel, "stride": stride})
    _compare(tmp_path, b, _image(rng, (1, 2, size, size)))


def test_pooling_rounding_over_many_random_geometries(tmp_path, rng):
    """40 random (pool, kernel, stride <= kernel, pad < kernel) on one 2x13x11 input, each layer an output,
    against OpenCV at once; a stride beyond the kernel whose last window misses the input is refused clearly."""
    b = CaffeNetBuilder()
    b.input("data", (1, 2, 13, 11))
    for i in range(40):
        kernel = int(rng.integers(1, 6))
        b.layer(f"pool{i}", "Pooling", "data", pooling_param={
            "pool": int(rng.integers(0, 2)), "kernel_size": kernel, "stride": int(rng.integers(1, kernel + 1)),
            "pad": int(rng.integers(0, kernel))})
    _compare(tmp_path, b, _image(rng, (1, 2, 13, 11)))
    b = CaffeNetBuilder()
    b.input("data", (1, 2, 11, 11))
    b.layer("pool", "Pooling", "data", pooling_param={"pool": 0, "kernel_size": 1, "stride": 3})
    proto, weights = b.write(str(tmp_path), "degenerate")
    with pytest.raises(InvalidInput, match="layer name=pool type=Pooling: its last window"):
        caffe_to_onnx(proto, weights)


def test_convolution_geometries(tmp_path, rng):
    """Random Convolution/Deconvolution (kernel_h/_w, stride_h/_w, pad_h/_w, dilation, group), each an output of
    one net, against OpenCV; a transposed InnerProduct against numpy (OpenCV's importer ignores ``transpose``)."""
    b = CaffeNetBuilder()
    b.input("data", (1, 4, 12, 10))
    for i in range(12):
        deconv = i % 3 == 2
        kh, kw = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        group, out = int(rng.choice([1, 2])), 2 * int(rng.integers(1, 4))
        param = {"num_output": out, "group": group, "kernel_h": kh, "kernel_w": kw,
                 "stride_h": int(rng.integers(1, 3)), "stride_w": int(rng.integers(1, 4)),
                 "pad_h": int(rng.integers(0, kh)), "pad_w": int(rng.integers(0, kw)),
                 "bias_term": bool(i % 2)}
        if not deconv:
            param["dilation"] = [int(rng.integers(1, 3))]
        weight = b.randn(4, out // group, kh, kw) if deconv else b.randn(out, 4 // group, kh, kw)
        blobs = [weight, b.randn(out)] if param["bias_term"] else [weight]
        b.layer(f"conv{i}", "Deconvolution" if deconv else "Convolution", "data", blobs=blobs, convolution_param=param)
    x = _image(rng, (1, 4, 12, 10))
    _compare(tmp_path, b, x)
    weight, bias = b.randn(4 * 12 * 10, 3), b.randn(3)  # Caffe keeps a transposed weight as K x N
    b.layer("fc_t", "InnerProduct", "data", blobs=[weight, bias], inner_product_param={"num_output": 3, "transpose": True})
    proto, weights = b.write(str(tmp_path), "fc_t")
    names, outs = _run(caffe_to_onnx(proto, weights), x)
    np.testing.assert_allclose(outs[names.index("fc_t")], x.reshape(1, -1) @ weight + bias, rtol=1e-5, atol=1e-5)


def test_global_pooling_deconv_group_dilation(tmp_path, rng):
    b = CaffeNetBuilder()
    b.input("data", (1, 4, 9, 9))
    b.layer("dw", "Convolution", "data", blobs=[b.randn(4, 1, 3, 3)],
            convolution_param={"num_output": 4, "group": 4, "kernel_size": [3], "dilation": [2], "bias_term": False})
    b.layer("up", "Deconvolution", "dw", blobs=[b.randn(4, 3, 4, 4), b.randn(3)],
            convolution_param={"num_output": 3, "kernel_size": [4], "stride": [2], "pad": [1]})
    b.layer("gap", "Pooling", "up", pooling_param={"pool": 1, "global_pooling": True})
    b.layer("gmp", "Pooling", "up", pooling_param={"pool": 0, "global_pooling": True})
    b.layer("cat", "Concat", ["gap", "gmp"])
    _compare(tmp_path, b, _image(rng, (1, 4, 9, 9)))


def test_activations_eltwise_power_lrn(tmp_path, rng):
    b = CaffeNetBuilder()
    b.input("data", (1, 4, 6, 6))
    b.layer("prelu", "PReLU", "data", blobs=[b.randn(4)])
    b.layer("prelu_shared", "PReLU", "data", blobs=[[0.2]], prelu_param={"channel_shared": True})
    b.layer("leaky", "ReLU", "data", relu_param={"negative_slope": 0.1})
    b.layer("sig", "Sigmoid", "prelu")
    b.layer("tanh", "TanH", "prelu_shared")
    b.layer("sum", "Eltwise", ["sig", "tanh", "leaky"], eltwise_param={"operation": 1, "coeff": [1.0, -0.5, 2.0]})
    b.layer("prod", "Eltwise", ["sum", "sig"], eltwise_param={"operation": 0})
    b.layer("max", "Eltwise", ["prod", "tanh"], eltwise_param={"operation": 2})
    b.layer("pow", "Power", "sig", power_param={"power": 2.0, "scale": 0.5, "shift": 1.0})
    b.layer("drop", "Dropout", "pow", "pow")
    b.layer("lrn", "LRN", "max", lrn_param={"local_size": 3, "alpha": 0.5, "beta": 0.75})
    b.layer("bn", "BatchNorm", "pow", blobs=[b.randn(4), np.abs(b.randn(4)) + 0.5, [1.0]])
    b.layer("scale", "Scale", ["lrn", "sig"], scale_param={"axis": 0})
    _compare(tmp_path, b, _image(rng, (1, 4, 6, 6)))


@pytest.mark.parametrize("across_spatial,channel_shared", [(False, False), (True, True), (False, True)])
def test_ssd_normalize(tmp_path, rng, across_spatial, channel_shared):
    b = CaffeNetBuilder()
    b.input("data", (1, 4, 5, 5))
    scale = [20.0] if channel_shared else b.randn(4) * 10 + 20
    b.layer("conv4_3_norm", "Normalize", "data", blobs=[scale],
            norm_param={"across_spatial": across_spatial, "channel_shared": channel_shared})
    _compare(tmp_path, b, _image(rng, (1, 4, 5, 5)))


def test_ssd_prior_boxes_are_a_constant(tmp_path, rng, caplog):
    """PriorBox (max_size, flipped ratios, clip, 4 variances; explicit step and offset) equals OpenCV's; as a net
    output it is left out (a constant is not something the board computes), a warning says so."""
    from bpuemu.host.caffe.layers import prior_boxes
    from bpuemu.host.caffe.reader import load_net

    b = CaffeNetBuilder()
    b.input("data", (1, 3, 30, 40))
    b.layer("f1", "Pooling", "data", pooling_param={"pool": 0, "kernel_size": 2, "stride": 2})
    b.layer("f2", "Pooling", "f1", pooling_param={"pool": 0, "kernel_size": 3, "stride": 3})
    b.layer("p1", "PriorBox", ["f1", "data"], prior_box_param={
        "min_size": [6.0], "max_size": [12.0], "aspect_ratio": [2.0], "flip": True, "clip": True,
        "variance": [0.1, 0.1, 0.2, 0.2]})
    b.layer("p2", "PriorBox", ["f2", "data"], prior_box_param={
        "min_size": [12.0, 20.0], "aspect_ratio": [2.0, 3.0], "flip": False, "clip": False, "variance": [0.1],
        "step": 8.0, "offset": 0.25})
    b.layer("mbox_priorbox", "Concat", ["p1", "p2"], concat_param={"axis": 2})
    b.layer("head", "Convolution", "f2", blobs=[b.randn(2, 3, 1, 1)], convolution_param={"num_output": 2,
                                                                                          "kernel_size": [1], "bias_term": False})
    proto, weights = b.write(str(tmp_path))
    x = _image(rng, (1, 3, 30, 40))
    net = load_net(proto, weights)
    params = {layer.name: layer.prior_box_param for layer in net.layers if layer.type == "PriorBox"}
    for name, feature_hw in (("p1", (15, 20)), ("p2", (5, 7))):  # f2: Caffe rounds 17/3 up
        ours = prior_boxes(params[name], feature_hw, (30, 40))
        assert relative_diff(ours, opencv_forward(proto, weights, x, [name])[0]) <= 1e-6, name
    with caplog.at_level("WARNING"):
        model = caffe_to_onnx(proto, weights)
    assert [o.name for o in model.graph.output] == ["head"]
    assert "output mbox_priorbox is a constant" in caplog.text
    assert [n.op_type for n in model.graph.node] == ["MaxPool", "MaxPool", "Conv"]


def test_lrn_k_is_the_bias(tmp_path, rng):
    """Caffe's across-channel LRN: x / (k + alpha/n * sum of squares over n channels)^beta.

    Checked against that formula: OpenCV's importer reads Caffe's ``k`` under
    another name and always uses 1.
    """
    b = CaffeNetBuilder()
    b.input("data", (1, 4, 3, 3))
    b.layer("lrn", "LRN", "data", lrn_param={"local_size": 3, "alpha": 0.5, "beta": 0.75, "k": 2.0})
    proto, weights = b.write(str(tmp_path))
    x = _image(rng, (1, 4, 3, 3))
    _, (y,) = _run(caffe_to_onnx(proto, weights), x)
    sq = np.pad(x ** 2, ((0, 0), (1, 1), (0, 0), (0, 0)))
    np.testing.assert_allclose(y, x / (2.0 + 0.5 / 3 * (sq[:, :4] + sq[:, 1:5] + sq[:, 2:])) ** 0.75, rtol=1e-5)


def test_structure_layers(tmp_path, rng):
    """Slice, Split, Flatten (partial), Reshape (0 and -1), Permute, Softmax over axis 1 of a 4-D blob."""
    b = CaffeNetBuilder()
    b.input("data", (1, 6, 4, 5))
    b.layer("slice", "Slice", "data", ["s0", "s1", "s2"], slice_param={"axis": 1, "slice_point": [1, 4]})
    b.layer("split", "Split", "s1", ["a", "b"])
    b.layer("perm", "Permute", "a", permute_param={"order": [0, 2, 3, 1]})
    b.layer("flat", "Flatten", "perm", flatten_param={"axis": 1, "end_axis": 2})
    b.layer("reshape", "Reshape", "b", reshape_param={"shape": {"dim": [0, -1, 2]}, "axis": 1, "num_axes": 2})
    b.layer("soft", "Softmax", "s2")
    b.layer("soft2", "Softmax", "s0", softmax_param={"axis": 3})
    b.layer("flatall", "Flatten", "soft")
    _compare(tmp_path, b, _image(rng, (1, 6, 4, 5)))


def test_argmax_default_axis_is_over_everything_but_the_first(tmp_path, rng):
    """Caffe's ArgMax without axis: per item, over C*H*W (the seed: ArgMax defaults differ from Softmax)."""
    b = CaffeNetBuilder()
    b.input("data", (2, 3, 4, 4))
    b.layer("flat_arg", "ArgMax", "data")
    b.layer("arg_c", "ArgMax", "data", argmax_param={"axis": 1})
    b.layer("top2", "ArgMax", "data", argmax_param={"top_k": 2, "out_max_val": True})
    proto, weights = b.write(str(tmp_path))
    x = _image(rng, (2, 3, 4, 4))
    names, outs = _run(caffe_to_onnx(proto, weights), x)
    got = dict(zip(names, outs))
    flat = x.reshape(2, -1)
    np.testing.assert_array_equal(got["flat_arg"], np.argmax(flat, axis=1).reshape(2, 1, 1).astype(np.float32))
    np.testing.assert_array_equal(got["arg_c"], np.argmax(x, axis=1)[:, None].astype(np.float32))
    order = np.argsort(-flat, axis=1)[:, :2]
    np.testing.assert_array_equal(got["top2"][:, 0], order.astype(np.float32))
    np.testing.assert_allclose(got["top2"][:, 1], np.take_along_axis(flat, order, axis=1))


def test_legacy_input_dim_and_input_shape_override(tmp_path, rng):
    b = CaffeNetBuilder()
    b.net.input.append("data")
    b.net.input_dim.extend([1, 3, 12, 12])
    b.layer("conv", "Convolution", "data", blobs=[b.randn(2, 3, 3, 3), b.randn(2)],
            convolution_param={"num_output": 2, "kernel_size": [3]})
    proto, weights = b.write(str(tmp_path))
    assert caffe_inputs(proto) == [("data", [1, 3, 12, 12])]
    model = caffe_to_onnx(proto, weights, {"data": (1, 3, 30, 20)})  # a fully convolutional net at another size
    with pytest.raises(InvalidInput, match="input shapes name \\['date'\\]"):
        caffe_to_onnx(proto, weights, {"date": (1, 3, 30, 20)})
    with pytest.raises(InvalidInput, match="Caffe input data has no fixed shape \\(1x3x0x20\\)"):
        caffe_to_onnx(proto, weights, {"data": (1, 3, 0, 20)})
    dims = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [1, 2, 28, 18]
    x = _image(rng, (1, 3, 30, 20))
    _, ours = _run(model, x)
    assert relative_diff(ours[0], opencv_forward(proto, weights, x, ["conv"])[0]) <= 1e-4


def test_v1_layers_with_legacy_4d_blobs(tmp_path, rng):
    """Caffe's older format: ``layers { type: CONVOLUTION }`` and blobs with num/channels/height/width."""
    from bpuemu.host.caffe import caffe_pb2
    from google.protobuf import text_format

    net = caffe_pb2.NetParameter(name="v1", input=["data"], input_dim=[1, 3, 8, 8])
    V1 = caffe_pb2.V1LayerParameter
    w, bias = rng.standard_normal((4, 3, 3, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    fc = rng.standard_normal((5, 4 * 3 * 3)).astype(np.float32)
    conv = net.layers.add(name="conv", type=V1.CONVOLUTION, bottom=["data"], top=["conv"])
    conv.convolution_param.num_output, conv.convolution_param.stride[:] = 4, [2]
    conv.convolution_param.kernel_size[:] = [3]
    conv.blobs.add(num=4, channels=3, height=3, width=3, data=w.ravel())
    conv.blobs.add(num=1, channels=1, height=1, width=4, data=bias)
    net.layers.add(name="relu", type=V1.RELU, bottom=["conv"], top=["conv"])
    ip = net.layers.add(name="fc", type=V1.INNER_PRODUCT, bottom=["conv"], top=["fc"])
    ip.inner_product_param.num_output = 5
    ip.blobs.add(num=1, channels=1, height=5, width=36, data=fc.ravel())
    ip.blobs.add(num=1, channels=1, height=1, width=5, data=np.zeros(5, np.float32))
    net.layers.add(name="prob", type=V1.SOFTMAX, bottom=["fc"], top=["prob"])
    (tmp_path / "v1.caffemodel").write_bytes(net.SerializeToString())
    deploy = caffe_pb2.NetParameter()
    deploy.CopyFrom(net)
    for layer in deploy.layers:
        del layer.blobs[:]
    (tmp_path / "v1.prototxt").write_text(text_format.MessageToString(deploy))
    proto, weights = str(tmp_path / "v1.prototxt"), str(tmp_path / "v1.caffemodel")
    model = caffe_to_onnx(proto, weights)
    x = _image(rng, (1, 3, 8, 8))
    names, ours = _run(model, x)
    assert names == ["prob"]
    assert relative_diff(ours[0], opencv_forward(proto, weights, x, names)[0]) <= 1e-4


def test_every_unsupported_layer_is_named_at_once(tmp_path):
    b = CaffeNetBuilder()
    b.input("data", (1, 3, 8, 8))
    b.layer("Convolution1", "Convolution", "data", blobs=[b.randn(4, 3, 1, 1)],
            convolution_param={"num_output": 4, "kernel_size": [1], "bias_term": False})
    b.layer("accuracy", "Accuracy", "Convolution1")
    b.layer("detection_out", "DetectionOutput", ["Convolution1", "data"])
    proto, weights = b.write(str(tmp_path))
    with pytest.raises(UnsupportedLayers) as e:
        caffe_to_onnx(proto, weights)
    assert str(e.value).splitlines()[:2] == ["Not support layer name=accuracy type=Accuracy",
                                             "Not support layer name=detection_out type=DetectionOutput"]
    assert "output_nodes" in e.value.hint
    # The documented recipe: cut before the post-processing layers with output_nodes.
    model = caffe_to_onnx(proto, weights, output_nodes=["Convolution1"])
    assert [o.name for o in model.graph.output] == ["Convolution1"]


def test_in_place_output_keeps_the_blob_name_and_bad_files_are_one_line(tmp_path):
    b = CaffeNetBuilder()
    b.input("data", (1, 2, 4, 4))
    b.layer("conv", "Convolution", "data", blobs=[b.randn(2, 2, 1, 1), b.randn(2)],
            convolution_param={"num_output": 2, "kernel_size": [1]})
    b.layer("relu", "ReLU", "conv", "conv")
    proto, weights = b.write(str(tmp_path))
    model = caffe_to_onnx(proto, weights)
    assert [o.name for o in model.graph.output] == ["conv"]
    assert model.graph.node[-1].name == "relu" and model.graph.node[-1].output[0] == "conv"
    (tmp_path / "bad.prototxt").write_text("layer { name: 'x' type: \n")
    with pytest.raises(InvalidInput, match="is not a Caffe prototxt"):
        caffe_to_onnx(str(tmp_path / "bad.prototxt"), weights)
    (tmp_path / "bad.caffemodel").write_bytes(b"\xff\xff\xff\xff")
    with pytest.raises(InvalidInput, match="is not a Caffe caffemodel"):
        caffe_to_onnx(proto, str(tmp_path / "bad.caffemodel"))


def test_checker_cli_names_the_unsupported_layer_like_the_seed(tmp_path):
    """The seed's example: an Accuracy layer in the prototxt -> 'Not support layer name=accuracy type=Accuracy'."""
    import os
    import subprocess
    import sys

    b = CaffeNetBuilder()
    b.input("data", (1, 3, 224, 224))
    b.layer("Convolution1", "Convolution", "data", blobs=[b.randn(128, 3, 1, 1)],
            convolution_param={"num_output": 128, "kernel_size": [1], "bias_term": False})
    b.layer("accuracy", "Accuracy", "Convolution1")
    proto, weights = b.write(str(tmp_path))
    exe = os.path.join(os.path.dirname(sys.executable), "hb_mapper")
    base = [exe, "checker", "--model-type", "caffe", "--march", "bayes-e", "--model", weights]
    proc = subprocess.run(base + ["--proto", proto], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "ERROR Not support layer name=accuracy type=Accuracy" in proc.stderr
    assert "Not support layer name=accuracy type=Accuracy" in (tmp_path / "hb_mapper_checker.log").read_text()
    proc = subprocess.run(base, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--model-type caffe needs --proto" in proc.stderr
