"""hb_mapper makertbin end to end: yaml + float model + calibration data -> the five artifacts."""
import logging
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

from bpuemu.board.runtime import Runtime
from bpuemu.common.container import read_bin
from bpuemu.common.input_types import random_rt_input, to_model_input
from bpuemu.host import HB_ONNXRuntime
from bpuemu.host.mapper.makertbin import makertbin_from_config

from makertbin_helpers import sample_project, text_image, write_cal_dir, write_config

ARTIFACTS = ("_original_float_model.onnx", "_optimized_float_model.onnx", "_calibrated_model.onnx",
             "_quantized_model.onnx", ".bin")


def _mapper(args, cwd):
    return subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_mapper", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def _cos(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("rt,layout", [("nv12", ""), ("rgb", "NHWC"), ("bgr", "NCHW"), ("yuv444", "NHWC")])
def test_cli_writes_five_artifacts_and_the_bin_matches_quanti_onnx(tmp_path, rt, layout):
    cfg, _ = sample_project(tmp_path, rt, layout)
    run = _mapper(["makertbin", "--config", cfg, "--model-type", "onnx"], tmp_path)
    assert run.returncode == 0, run.stderr
    for line in ("Convert to runtime bin file successfully!", "End Model Convert", "Cosine Similarity", "Select "):
        assert line in run.stderr
    log = (tmp_path / "hb_mapper_makertbin.log").read_text()
    assert "Convert to runtime bin file successfully!" in log and "Node" in log
    out = tmp_path / "model_output"
    for suffix in ARTIFACTS:
        assert (out / f"sample{suffix}").is_file(), suffix
    quant = onnx.load(str(out / "sample_quantized_model.onnx"))
    assert quant.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT8
    calibrated = onnx.load(str(out / "sample_calibrated_model.onnx"))
    assert any(n.name.endswith("_HzCalibration") for n in calibrated.graph.node)
    original = onnx.load(str(out / "sample_original_float_model.onnx"))
    assert any(n.name == "HzPreprocess" for n in original.graph.node)

    rt_ = Runtime()
    rt_.load(str(out / "sample.bin"))
    m = rt_.model()
    spec = m.model.input_specs[0]
    assert spec.input_type_rt == rt and spec.model_dtype == "int8"
    sess = HB_ONNXRuntime(str(out / "sample_quantized_model.onnx"))
    for seed in range(3):
        x = random_rt_input(spec, np.random.default_rng(seed))
        got = m.run([x])[0]
        ref = sess.run(None, {"data": to_model_input(x, spec)})[0]
        assert np.array_equal(got, ref)


def test_quantized_model_tracks_the_float_model_on_held_out_images(tmp_path):
    cfg, onnx_path = sample_project(tmp_path, "rgb", "NHWC", samples=16)
    art = makertbin_from_config(cfg)
    rt_ = Runtime()
    rt_.load(art.bin)
    m = rt_.model()
    import onnxruntime as ort

    fsess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(99)
    mean = np.array([123.68, 116.78, 103.94], np.float32)[None, :, None, None]
    for _ in range(4):
        rgb = text_image(32, 32, rng)
        ref = fsess.run(None, {"data": (rgb.transpose(2, 0, 1)[None].astype(np.float32) - mean) * np.float32(0.017)})[0]
        got = m.run([rgb[None]])[0]
        assert _cos(got, ref) >= 0.99
    assert art.cosines and min(art.cosines.values()) > 0.9


def test_build_info_carries_the_config_for_hb_model_info(tmp_path):
    cfg, _ = sample_project(tmp_path)
    art = makertbin_from_config(cfg)
    info = read_bin(art.bin).model().build_info
    keys = {kv.key: kv.value for kv in info.model_parameters}
    assert keys["BPU march"] == "bayes-e"
    assert info.input_parameters[0].input_name == "data"
    params = {kv.key: kv.value for kv in info.input_parameters[0].params}
    assert params["input_type_rt"] == "nv12" and params["input_type_train"] == "rgb"
    assert {kv.key for kv in info.calibration_parameters} >= {"calibration_type"}
    assert any(kv.key == "hb_mapper version" for kv in info.deps)


@pytest.mark.parametrize("ctype", ["max", "kl", "mix", "skip"])
def test_calibration_types_convert(tmp_path, ctype):
    extra = {"calibration_type": ctype}
    cfg, _ = sample_project(tmp_path, calibration=extra)
    art = makertbin_from_config(cfg)
    assert os.path.isfile(art.bin)


def test_dump_calibration_data(tmp_path):
    cfg, _ = sample_project(tmp_path, samples=3)
    import yaml

    doc = yaml.safe_load(open(cfg))
    doc["model_parameters"]["debug_mode"] = "dump_calibration_data"
    yaml.safe_dump(doc, open(cfg, "w"))
    makertbin_from_config(cfg)
    d = tmp_path / "model_output" / "calibration_data" / "data"
    files = sorted(os.listdir(d))
    assert files == ["0.npy", "1.npy", "2.npy"]
    assert np.load(d / "0.npy").shape == (1, 32, 32, 3)  # nv12 -> NHWC model input


def test_featuremap_two_inputs(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Conv", ["s", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 8, 8]) for n in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], initializer=[w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "two.onnx"))
    dirs = {n: write_cal_dir(str(tmp_path / f"cal_{n}"), [rng.standard_normal((1, 2, 8, 8)).astype(np.float32) for _ in range(6)])
            for n in "ab"}
    inputs = {n: {"input_type_train": "featuremap", "input_layout_train": "NCHW", "input_type_rt": "featuremap",
                  "input_layout_rt": "NCHW", "norm_type": "no_preprocess", "input_shape": "1x2x8x8",
                  "cal_data_dir": dirs[n], "cal_data_type": "float32"} for n in "ab"}
    cfg = write_config(str(tmp_path / "two.yaml"), str(tmp_path / "two.onnx"), "two", str(tmp_path / "out"), inputs,
                       calibration={"calibration_type": "max"})
    art = makertbin_from_config(cfg)
    rt_ = Runtime()
    rt_.load(art.bin)
    m = rt_.model()
    assert [s.input_type_rt for s in m.model.input_specs] == ["featuremap", "featuremap"]
    a, b = (rng.standard_normal((1, 2, 8, 8)).astype(np.float32) for _ in range(2))
    got = m.run({"a": a, "b": b})[0]
    ref = HB_ONNXRuntime(art.quantized).run(None, {"a": a, "b": b})[0]
    assert np.array_equal(got, ref)


def test_fast_perf(tmp_path):
    from bpuemu.host.samples import sample_float_model

    onnx.save(sample_float_model(16, 16, image_input=False), str(tmp_path / "m.onnx"))
    run = _mapper(["makertbin", "--fast-perf", "--model", str(tmp_path / "m.onnx"), "--model-type", "onnx",
                   "--march", "bayes-e", "-i", "data", "1x3x16x16"], tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "model_output" / "m.bin").is_file()
    plan = read_bin(str(tmp_path / "model_output" / "m.bin")).model().plan
    assert not any(s.kind == 3 for s in plan), "fast-perf should put Softmax on the BPU"


@pytest.mark.parametrize("break_it,words", [
    ("missing_cal_dir", "cal_data_dir"),
    ("wrong_cal_size", "needs 3072"),
    ("missing_model", "onnx_model"),
    ("bad_combo", "input_type_rt"),
    ("shape_mismatch", "input_shape"),
])
def test_bad_input_is_one_clear_error_and_no_bin(tmp_path, break_it, words):
    import shutil

    import yaml

    cfg, onnx_path = sample_project(tmp_path, "rgb", "NHWC", samples=2)
    doc = yaml.safe_load(open(cfg))
    if break_it == "missing_cal_dir":
        shutil.rmtree(tmp_path / "cal")
    elif break_it == "wrong_cal_size":
        (tmp_path / "cal" / "0000.bin").write_bytes(b"\0" * 100)
        doc["calibration_parameters"]["cal_data_type"] = "uint8"
    elif break_it == "missing_model":
        os.unlink(onnx_path)
    elif break_it == "bad_combo":
        doc["input_parameters"]["input_type_rt"] = "gray"
    elif break_it == "shape_mismatch":
        doc["input_parameters"]["input_shape"] = "1x3x64x64"
    yaml.safe_dump(doc, open(cfg, "w"))
    run = _mapper(["makertbin", "--config", cfg, "--model-type", "onnx"], tmp_path)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert "exception in command: makertbin" in run.stderr
    assert words in run.stderr, run.stderr
    assert not (tmp_path / "model_output" / "sample.bin").exists()


def test_checker_table_and_log(tmp_path):
    cfg, onnx_path = sample_project(tmp_path, samples=1)
    run = _mapper(["checker", "--model-type", "onnx", "--march", "bayes-e", "--model", onnx_path,
                   "--input-shape", "data", "1x3x32x32"], tmp_path)
    assert run.returncode == 0, run.stderr
    out = run.stderr
    assert "Node" in out and "Subgraph" in out and "HzSQuantizedConv" in out and "id(0)" in out
    assert "Softmax_prob" in out and "runs on CPU" in out
    assert (tmp_path / "hb_mapper_checker.log").is_file()


def test_checker_refuses_an_unknown_operator(tmp_path):
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Accuracy", ["x"], ["y"], name="accuracy", domain="caffe")], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11), helper.make_opsetid("caffe", 1)])
    onnx.save(m, str(tmp_path / "bad.onnx"))
    run = _mapper(["checker", "--model-type", "onnx", "--march", "bayes-e", "--model", str(tmp_path / "bad.onnx")], tmp_path)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "Not support layer name=accuracy type=Accuracy" in run.stderr


def test_hb_mapper_infer_writes_float_bins(tmp_path):
    cfg, _ = sample_project(tmp_path, "rgb", "NHWC", samples=2)
    art = makertbin_from_config(cfg)
    img = tmp_path / "cal" / "0000.bin"
    run = _mapper(["infer", "--config", cfg, "--model-file", art.quantized, "--model-type", "onnx",
                   "--image-file", "data", str(img), "--output-dir", str(tmp_path / "inf")], tmp_path)
    assert run.returncode == 0, run.stderr
    out = np.fromfile(tmp_path / "inf" / "prob_float.bin", dtype=np.float32)
    assert out.shape == (10,) and abs(out.sum() - 1) < 1e-3


@pytest.mark.parametrize("model_file, message", [
    ("missing.onnx", "model file not found: "),
    ("cal", "is a directory, not an ONNX model"),
    ("cal/0000.bin", "is not a readable ONNX model"),
])
def test_hb_mapper_infer_bad_model_file_is_one_line(tmp_path, model_file, message):
    cfg, _ = sample_project(tmp_path, "rgb", "NHWC", samples=1)
    run = _mapper(["infer", "--config", cfg, "--model-file", str(tmp_path / model_file), "--model-type", "onnx",
                   "--image-file", "data", str(tmp_path / "cal" / "0000.bin"), "--output-dir", str(tmp_path / "inf")],
                  tmp_path)
    assert run.returncode != 0 and "Traceback" not in run.stderr and "internal error" not in run.stderr
    assert message in run.stderr


def test_remove_node_type_in_the_yaml_strips_the_tail(tmp_path):
    import yaml

    from bpuemu.common.proto import model_pb2

    cfg, _ = sample_project(tmp_path, "rgb", "NHWC", samples=3)
    doc = yaml.safe_load(open(cfg))
    doc["model_parameters"]["remove_node_type"] = "Softmax;Dequantize"
    yaml.safe_dump(doc, open(cfg, "w"))
    art = makertbin_from_config(cfg)
    model = read_bin(art.bin).model()
    assert list(model.build_info.deleted_nodes) == ["Softmax_prob", "logits_DequantizeLinear_HzDequantize"]
    out = model.outputs[0]
    assert out.tensor_type == model_pb2.HB_DNN_TENSOR_TYPE_S8 and out.quanti_type == model_pb2.SCALE
    rt_ = Runtime()
    rt_.load(art.bin)
    x = random_rt_input(model.input_specs[0], np.random.default_rng(0))
    raw = rt_.model().run([x])[0]
    assert raw.dtype == np.int8
    # The raw logits, dequantized with the reported scale, are what the quantized model's Softmax reads.
    logits = (raw.astype(np.float32) - out.zero_point_data[0]) * np.float32(out.scale_data[0])
    probs = HB_ONNXRuntime(art.quantized).run(None, {"data": to_model_input(x, model.input_specs[0])})[0]
    e = np.exp(logits - logits.max())
    np.testing.assert_allclose(e / e.sum(), probs, rtol=1e-5, atol=1e-6)


def test_preprocess_on_reads_images_and_output_nodes_cuts_the_model(tmp_path):
    import yaml
    from PIL import Image

    cfg, _ = sample_project(tmp_path, "nv12", samples=1)
    imgs = tmp_path / "images"
    imgs.mkdir()
    rng = np.random.default_rng(4)
    for i in range(4):  # 48x40 JPEGs: resized to the 32x32 input by the tool
        Image.fromarray(text_image(40, 48, rng)).save(imgs / f"{i}.jpg")
    doc = yaml.safe_load(open(cfg))
    doc["calibration_parameters"].update({"cal_data_dir": str(imgs), "preprocess_on": True})
    doc["calibration_parameters"].pop("cal_data_type", None)
    doc["model_parameters"]["output_nodes"] = "Gemm_fc"
    yaml.safe_dump(doc, open(cfg, "w"))
    run = _mapper(["makertbin", "--config", cfg, "--model-type", "onnx"], tmp_path)
    assert run.returncode == 0, run.stderr
    assert "calibration data: 4/4 sample(s) read" in run.stderr
    model = read_bin(str(tmp_path / "model_output" / "sample.bin")).model()
    assert [o.name for o in model.outputs] == ["logits"]  # cut at Gemm_fc: no Softmax
    assert not any(s.name == "Softmax_prob" for s in model.plan)


def test_cosine_column_reports_a_fused_conv_at_its_relu_output(tmp_path, caplog):
    cfg, _ = sample_project(tmp_path, "rgb", "NHWC", samples=4)
    with caplog.at_level(logging.INFO, logger="bpuemu.host.makertbin"):
        art = makertbin_from_config(cfg)
    for conv in ("Conv_0", "Conv_1_dw", "Conv_2"):
        assert art.cosines[conv] == art.cosines[f"{conv}_relu"] > 0.99, art.cosines
    row = next(line for line in art.table.splitlines() if line.split()[:1] == ["Conv_1_dw"])
    assert f"{art.cosines['Conv_1_dw']:.6f}" in row
    assert any("taken at that activation's output" in m for m in caplog.messages)


def test_calibration_type_load_places_the_qat_model_on_its_float_graph(tmp_path):
    """A QDQ model (onnxruntime's quantize_static of a float CNN, standing in for a QAT export)
    converts with calibration_type load and no calibration data. Placed on its float graph, every
    node -- Relu, pooling and Flatten included -- joins one BPU subgraph (on the QDQ graph they
    would sit between Q/DQ nodes and fall to the CPU); the .bin reproduces quanti.onnx bit-exactly,
    and both agree with the QAT model itself within one step of the output scale."""
    import onnxruntime as ort
    from onnx import numpy_helper

    from bpuemu.board.runtime.sessions import session_options
    from bpuemu.host.samples import MEAN, SCALE, sample_float_model
    from quant_models import ort_quantize_static

    def normalised(page):
        return ((page.transpose(2, 0, 1)[None].astype(np.float32) - MEAN[None, :, None, None]) * SCALE).astype(np.float32)

    rng = np.random.default_rng(3)
    pages = [text_image(32, 32, rng) for _ in range(12)]
    qat = ort_quantize_static(sample_float_model(32, 32, image_input=False), [{"data": normalised(p)} for p in pages[:8]], True)
    onnx.save(qat, str(tmp_path / "qat.onnx"))
    cfg = write_config(str(tmp_path / "qat.yaml"), str(tmp_path / "qat.onnx"), "qat", str(tmp_path / "out"),
                       {"data": {"input_type_train": "rgb", "input_layout_train": "NCHW", "input_type_rt": "rgb",
                                 "input_layout_rt": "NHWC", "norm_type": "data_mean_and_scale",
                                 "mean_value": "123.68 116.78 103.94", "scale_value": "0.017", "input_shape": "1x3x32x32"}},
                       calibration={"calibration_type": "load"})
    art = makertbin_from_config(cfg)

    rows = [line.split() for line in art.table.splitlines()[3:] if line.strip() and not line.startswith("=")]
    names = {r[0] for r in rows}
    assert {"Conv_0_relu", "GlobalAveragePool_0", "Flatten_0", "Gemm_fc"} <= names
    assert not any("QuantizeLinear" in n or "DequantizeLinear" in n for n in names), names
    assert all(r[1] == "BPU" and r[2] == "id(0)" for r in rows), art.table
    model = read_bin(art.bin).model()
    assert [s.name for s in model.plan if s.name.startswith("BPU_")] == ["BPU_qat_subgraph_0"]

    q = onnx.load(art.quantized)
    consts = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    out_dq = next(n for n in q.graph.node if n.output[0] == "prob")
    lsb = float(consts[out_dq.input[1]])
    rt_ = Runtime()
    rt_.load(art.bin)
    m = rt_.model()
    spec = m.model.input_specs[0]
    qsess = HB_ONNXRuntime(art.quantized)
    qat_sess = ort.InferenceSession(str(tmp_path / "qat.onnx"), session_options(), providers=["CPUExecutionProvider"])
    for page in pages[8:]:
        got = m.run([page[None]])[0]
        assert np.array_equal(got, qsess.run(None, {"data": to_model_input(page[None], spec)})[0])
        qat_out = qat_sess.run(None, {"data": normalised(page)})[0]
        assert np.abs(got - qat_out).max() <= lsb * 1.001, (got, qat_out)


def test_the_float_model_is_read_once_per_run(tmp_path, monkeypatch):
    """Config completion, the custom-op check and the pipeline share one read of the float
    model (a large model was parsed three times per run)."""
    cfg, onnx_path = sample_project(tmp_path, "nv12", "", samples=2)
    reads = []
    real_load = onnx.load

    def counting_load(f, *args, **kwargs):
        if os.path.abspath(str(f)) == os.path.abspath(onnx_path):
            reads.append(f)
        return real_load(f, *args, **kwargs)

    monkeypatch.setattr(onnx, "load", counting_load)
    art = makertbin_from_config(cfg)
    assert os.path.isfile(art.bin)
    assert len(reads) == 1, reads
