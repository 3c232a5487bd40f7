"""hb_compile, the J6 conversion (ptq_faq_j6): the command, its yaml, its artifacts and node table."""
import csv
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import yaml
from j6_helpers import cal_dir, conv_model, tiny_project, write_yaml

from bpuemu.board.runtime import FOLLOW_MODEL, Runtime
from bpuemu.common.container import read_bc, read_bin
from bpuemu.common.errors import InvalidInput
from bpuemu.host.config.j6 import load_compile_config
from bpuemu.host.config.loader import complete_config
from bpuemu.host.mapper.hb_compile import compile_fast_perf, compile_from_config

J6_ARTIFACTS = ("tiny_original_float_model.onnx", "tiny_optimized_float_model.onnx", "tiny_calibrated_model.onnx",
                "tiny_ptq_model.onnx", "tiny_quantized_model.bc", "tiny.hbm", "tiny_node_info.csv")


def hb_compile(cwd, *args):
    """The command as a user types it (python -m: the console script's module), in ``cwd``."""
    return subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_compile", *args], cwd=str(cwd),
                          capture_output=True, text=True, timeout=300)


def test_config_writes_the_j6_artifacts_and_hb_compile_log(tmp_path):
    cfg = tiny_project(tmp_path, march="nash-p")
    run = hb_compile(tmp_path, "-c", "config.yaml")
    assert run.returncode == 0, run.stderr
    out = tmp_path / "model_output"
    assert sorted(os.listdir(out)) == sorted(J6_ARTIFACTS)
    hbm = read_bin(out / "tiny.hbm")
    assert (hbm.kind, hbm.model().march) == ("hbm", "nash-p")
    bc = read_bc(out / "tiny_quantized_model.bc")
    assert bc.manifest.march == "nash-p" and [n.name for n in bc.manifest.nodes] == ["conv1", "relu1", "conv2"]
    assert onnx.load_from_string(bc.onnx_bytes) == onnx.load(str(out / "tiny_ptq_model.onnx"))
    log = (tmp_path / "hb_compile.log").read_text()
    assert "Convert to runtime hbm file successfully!" in log and "hbm model saved: " in log
    assert os.path.isfile(cfg)
    # the ptq model is standard ONNX that stock onnxruntime runs
    import onnxruntime as ort

    sess = ort.InferenceSession(str(out / "tiny_ptq_model.onnx"))
    assert sess.run(None, {"data": np.zeros((1, 3, 8, 8), np.float32)})[0].shape == (1, 2, 8, 8)


def test_the_hbm_runs_in_the_runtime_like_the_ptq_model(tmp_path):
    art = compile_from_config(tiny_project(tmp_path))
    rt = Runtime(march="nash-e")
    rt.load([art.bin])
    x = np.random.default_rng(3).normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
    got = rt.model().run({"data": x})[0]
    from bpuemu.host.onnxgraph import open_session

    ref = open_session(onnx.load(art.quantized)).run(None, {"data": x})[0]   # the board's session options
    assert np.array_equal(got, ref)


def test_fast_perf_converts_a_model_without_a_config(tmp_path):
    conv_model(str(tmp_path / "m.onnx"))
    run = hb_compile(tmp_path, "--fast-perf", "--model", "m.onnx", "--march", "nash-e")
    assert run.returncode == 0, run.stderr
    hbm = read_bin(tmp_path / "model_output" / "m.hbm")
    assert hbm.model().march == "nash-e"
    params = {kv.key: kv.value for kv in hbm.model().build_info.compiler_parameters}
    assert "--O2" in params["hbdk_pass_through_params"]
    assert "Convert to runtime hbm file successfully!" in (tmp_path / "hb_compile.log").read_text()


def test_fast_perf_takes_input_shape_for_a_dynamic_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = conv_model(str(tmp_path / "dyn.onnx"))
    m = onnx.load(path)
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.shape.dim[2].dim_param = "h"
    onnx.save(m, path)
    bad = hb_compile(tmp_path, "--fast-perf", "--model", "dyn.onnx", "--march", "nash-m")
    assert bad.returncode != 0 and "dynamic shape" in bad.stderr and "Traceback" not in bad.stderr
    art = compile_fast_perf(path, "nash-m", {"data": (1, 3, 16, 8)})
    assert list(read_bin(art.bin).model().inputs[0].valid_shape) == [1, 3, 16, 8]
    assert art.bin == str(tmp_path / "model_output" / "dyn.hbm")


def _one_error_line(run):
    lines = [ln for ln in run.stderr.splitlines() if "ERROR" in ln]
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    return lines[0]


@pytest.mark.parametrize("group,key,value,answer", [
    ("input_parameters", "input_layout_train", "NCHW", "keeps the ONNX model's layout"),
    ("input_parameters", "input_layout_rt", "NHWC", "keeps the ONNX model's layout"),
    ("calibration_parameters", "run_on_cpu", "conv2", "quant_config"),
    ("model_parameters", "node_info", {"conv2": {"ON": "CPU"}}, "quant_config"),
    ("model_parameters", "layer_out_dump", True, "dump_all_layers_output"),
])
def test_keys_the_j6_flow_does_not_have_get_one_line(tmp_path, group, key, value, answer):
    cfg = tiny_project(tmp_path)
    doc = yaml.safe_load(open(cfg))
    doc[group][key] = value
    yaml.safe_dump(doc, open(cfg, "w"))
    line = _one_error_line(hb_compile(tmp_path, "-c", "config.yaml"))
    assert f"{key} ({group}) is not a J6 key" in line and answer in line
    assert not (tmp_path / "model_output").exists()


@pytest.mark.parametrize("opset,ir,ok", [(9, 8, False), (10, 8, True), (19, 9, True), (20, 10, False), (13, 10, False)])
def test_onnx_opset_and_ir_version_as_the_faq_accepts(tmp_path, opset, ir, ok):
    conv_model(str(tmp_path / "m.onnx"), opset=opset, ir_version=ir)
    run = hb_compile(tmp_path, "--fast-perf", "--model", "m.onnx", "--march", "nash-b")
    if ok:
        assert run.returncode == 0, run.stderr
    else:
        line = _one_error_line(run)
        assert ("10 <= opset_version <= 19" in line) if not 10 <= opset <= 19 else ("ir_version <= 9" in line)


def test_optimize_level_o3_is_refused_o0_to_o2_accepted(tmp_path):
    cfg = tiny_project(tmp_path)
    doc = yaml.safe_load(open(cfg))
    doc["compiler_parameters"]["optimize_level"] = "O3"
    yaml.safe_dump(doc, open(cfg, "w"))
    line = _one_error_line(hb_compile(tmp_path, "-c", "config.yaml"))
    assert "optimize_level O3" in line and "O0, O1, O2" in line
    for level in ("O0", "O1"):
        doc["compiler_parameters"]["optimize_level"] = level
        yaml.safe_dump(doc, open(cfg, "w"))
        art = compile_from_config(cfg)
        params = {kv.key: kv.value for kv in read_bin(art.bin).model().build_info.compiler_parameters}
        assert f"--{level}" in params["hbdk_pass_through_params"]


def test_march_must_be_a_j6_march(tmp_path):
    cfg = tiny_project(tmp_path)
    doc = yaml.safe_load(open(cfg))
    doc["model_parameters"]["march"] = "bayes-e"
    yaml.safe_dump(doc, open(cfg, "w"))
    line = _one_error_line(hb_compile(tmp_path, "-c", "config.yaml"))
    assert "not a J6 march" in line and "hb_mapper makertbin" in line


def test_shape_inference_failure_writes_shape_inference_fail_onnx(tmp_path):
    path = conv_model(str(tmp_path / "bad.onnx"))
    m = onnx.load(path)
    # conv2 outputs 2 channels; an Add with a 5-channel constant cannot be shaped
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((1, 5, 8, 8), np.float32), "five"))
    m.graph.node.append(onnx.helper.make_node("Add", ["c2", "five"], ["sum"], name="bad_add"))
    m.graph.output[0].name = "sum"
    del m.graph.output[0].type.tensor_type.shape.dim[:]
    onnx.save(m, path)
    cal = cal_dir(str(tmp_path), {"data": (1, 3, 8, 8)})
    write_yaml(str(tmp_path / "config.yaml"), "bad.onnx", inputs={"data": {"cal_data_dir": cal["data"]}})
    line = _one_error_line(hb_compile(tmp_path, "-c", "config.yaml"))
    assert "shape inference failed" in line
    fail = tmp_path / "model_output" / "shape_inference_fail.onnx"
    assert onnx.load(str(fail)).graph.node[-1].name == "bad_add"


def test_quant_config_is_handed_on_as_given(tmp_path):
    """The loader's part only: a JSON file (absolute path) or an inline mapping reaches ConvertJob.quant_config."""
    from bpuemu.host.mapper.hb_compile import j6_job

    cfg = tiny_project(tmp_path)
    (tmp_path / "qc.json").write_text('{"model_config": {"all_node_type": "int16"}}')
    doc = yaml.safe_load(open(cfg))
    doc["calibration_parameters"]["quant_config"] = "qc.json"
    yaml.safe_dump(doc, open(cfg, "w"))
    ccfg = load_compile_config(cfg)
    job = j6_job(ccfg, complete_config(ccfg.config, [("data", [1, 3, 8, 8])]), None)
    assert job.quant_config == str(tmp_path / "qc.json") and job.march_spec.name == "nash-e"
    doc["calibration_parameters"]["quant_config"] = {"op_config": {"Conv": {"qtype": "int16"}}}
    yaml.safe_dump(doc, open(cfg, "w"))
    assert load_compile_config(cfg).quant_config == {"op_config": {"Conv": {"qtype": "int16"}}}
    doc["calibration_parameters"]["quant_config"] = "missing.json"
    yaml.safe_dump(doc, open(cfg, "w"))
    with pytest.raises(InvalidInput, match="quant_config .* does not exist"):
        load_compile_config(cfg)


def _log_table(log: str):
    """The node table of hb_compile.log as rows of cells (split on 2+ spaces)."""
    import re

    lines = [ln.split(" INFO ", 1)[1] for ln in log.splitlines() if " INFO " in ln]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Node ") and "Output Data Type" in ln)
    rows = []
    for ln in lines[start + 2:]:
        if ln.startswith("="):
            continue
        cells = re.split(r"\s{2,}", ln.strip())
        if len(cells) != 7:
            break
        rows.append(cells)
    return re.split(r"\s{2,}", lines[start].strip()), rows


def test_node_table_in_the_log_and_node_info_csv_agree(tmp_path):
    # Cast is not a BPU op in bpuemu's table: it runs on the CPU, here with an int32 output
    path = conv_model(str(tmp_path / "m.onnx"))
    m = onnx.load(path)
    m.graph.node.append(onnx.helper.make_node("Cast", ["c2"], ["idx"], name="cast", to=onnx.TensorProto.INT32))
    m.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("idx", onnx.TensorProto.INT32, [1, 2, 8, 8]))
    onnx.save(m, path)
    cal = cal_dir(str(tmp_path), {"data": (1, 3, 8, 8)})
    write_yaml(str(tmp_path / "config.yaml"), "m.onnx", prefix="tiny", inputs={"data": {"cal_data_dir": cal["data"]}})
    assert hb_compile(tmp_path, "-c", "config.yaml").returncode == 0
    header, rows = _log_table((tmp_path / "hb_compile.log").read_text())
    assert header == ["Node", "ON", "Subgraph", "Type", "Output Data Type", "Calibrated Cosine", "Threshold"]
    with open(tmp_path / "model_output" / "tiny_node_info.csv") as f:
        table = list(csv.reader(f))
    # the csv has the log table's columns and a Note (why a node is on the CPU, a qtype or a nan cosine)
    assert table[0] == header + ["Note"] and [r[:7] for r in table[1:]] == rows
    assert {r[0]: r for r in table}["cast"][7] == "not supported by the BPU"
    by = {r[0]: r for r in rows}
    assert by["cast"][1:3] == ["CPU", "--"] and by["cast"][4] == "int32"
    # the last quantized op before the CPU's Cast is the tail Conv: nash-e's high-accuracy int32 (ptq_faq_j6 case 1)
    assert by["conv2"][1] == "BPU" and by["conv2"][4] == "int32"
    assert 0.9 < float(by["conv1"][5]) <= 1.0000001
    bc = read_bc(tmp_path / "model_output" / "tiny_quantized_model.bc")
    assert {n.name: (n.on, n.output_dtype) for n in bc.manifest.nodes}["cast"] == ("CPU", "int32")


def test_removed_nodes_give_a_quantized_removed_model_bc(tmp_path):
    """remove_node_type Dequantize: the .hbm and *_quantized_removed_model.bc end in int8; *_quantized_model.bc does not.
    The model ends in a MatMul (int8), not in a tail Conv, whose int32 output has no Dequantize to remove."""
    cfg = tiny_project(tmp_path, matmul=True)
    doc = yaml.safe_load(open(cfg))
    doc["model_parameters"]["remove_node_type"] = "Dequantize"
    yaml.safe_dump(doc, open(cfg, "w"))
    art = compile_from_config(cfg)
    assert art.removed_bc == str(tmp_path / "model_output" / "tiny_quantized_removed_model.bc")
    removed = read_bc(art.removed_bc)
    assert list(removed.manifest.removed_nodes) and removed.manifest.march == "nash-e"
    elem = lambda m: m.graph.output[0].type.tensor_type.elem_type  # noqa: E731
    assert elem(onnx.load_from_string(removed.onnx_bytes)) == onnx.TensorProto.INT8
    assert elem(onnx.load_from_string(read_bc(art.bc).onnx_bytes)) == onnx.TensorProto.FLOAT
    from bpuemu.common.proto import model_pb2

    assert read_bin(art.bin).model().outputs[0].tensor_type == model_pb2.HB_DNN_TENSOR_TYPE_S8
    # the removed .bc computes the .hbm's int8 output
    rt = Runtime(march=FOLLOW_MODEL)
    rt.load([art.bin])
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
    from bpuemu.host.onnxgraph import open_session

    ref = open_session(onnx.load_from_string(removed.onnx_bytes)).run(None, {"data": x})[0]
    assert np.array_equal(rt.model().run({"data": x})[0], ref)


@pytest.mark.parametrize("march, dtype", [("nash-e", "int32"), ("nash-b", "float32")])
def test_removing_dequantize_behind_a_tail_conv_says_there_is_none(tmp_path, march, dtype):
    """remove_node_type Dequantize on a model ending in Conv (ptq_faq_j6 case 1: the tail is int32 / float32,
    unquantized): there is no Dequantize to remove; hb_compile.log says so in one line, and nothing is removed."""
    cfg = tiny_project(tmp_path, march=march)
    doc = yaml.safe_load(open(cfg))
    doc["model_parameters"]["remove_node_type"] = "Dequantize"
    yaml.safe_dump(doc, open(cfg, "w"))
    run = hb_compile(tmp_path, "-c", "config.yaml")
    assert run.returncode == 0, run.stderr
    log = (tmp_path / "hb_compile.log").read_text()
    lines = [ln for ln in log.splitlines() if "remove_node_type Dequantize" in ln]
    assert len(lines) == 1 and f"the tail Conv conv2 outputs {dtype} unquantized on {march}" in lines[0], log
    assert "nothing to remove" in lines[0]
    assert not os.path.exists(tmp_path / "model_output" / "tiny_quantized_removed_model.bc")
    assert not list(read_bin(tmp_path / "model_output" / "tiny.hbm").model().build_info.deleted_nodes)


def test_fast_perf_converts_a_caffe_model_with_proto(tmp_path):
    from caffe_nets import CaffeNetBuilder

    b = CaffeNetBuilder("small")
    b.input("data", (1, 3, 8, 8))
    b.layer("conv1", "Convolution", "data", blobs=[b.randn(4, 3, 3, 3), b.randn(4)],
            convolution_param={"num_output": 4, "kernel_size": [3], "pad": [1]})
    b.layer("relu1", "ReLU", "conv1", "conv1")
    proto, weights = b.write(str(tmp_path), "small")
    run = hb_compile(tmp_path, "--fast-perf", "--proto", proto, "--model", weights, "--march", "nash-b")
    assert run.returncode == 0, run.stderr
    hbm = read_bin(tmp_path / "model_output" / "small.hbm")
    assert hbm.model().march == "nash-b" and list(hbm.model().inputs[0].valid_shape) == [1, 3, 8, 8]


def test_std_value_stands_for_scale_value(tmp_path):
    """ptq_faq_j6 names mean_value, scale_value and std_value: std 127.5 is scale 1/127.5."""
    cfg = tiny_project(tmp_path)
    doc = yaml.safe_load(open(cfg))
    doc["input_parameters"].update(input_type_train="rgb", input_type_rt="rgb", norm_type="data_mean_and_scale",
                                   mean_value="127.5", std_value="127.5 64 32")
    yaml.safe_dump(doc, open(cfg, "w"))
    inp = load_compile_config(cfg).config.inputs[0]
    assert inp.scale_value == (1 / 127.5, 1 / 64, 1 / 32) and inp.mean_value == (127.5,)
    doc["input_parameters"]["scale_value"] = "0.5"
    yaml.safe_dump(doc, open(cfg, "w"))
    with pytest.raises(InvalidInput, match="std_value and scale_value .* are both given"):
        load_compile_config(cfg)


def test_the_hbm_records_the_j6_parameters(tmp_path):
    cfg = tiny_project(tmp_path)
    doc = yaml.safe_load(open(cfg))
    doc["calibration_parameters"]["quant_config"] = {"model_config": {"all_node_type": "int16"}}
    doc["model_parameters"]["debug_mode"] = "dump_all_layers_output"
    yaml.safe_dump(doc, open(cfg, "w"))
    info = read_bin(compile_from_config(cfg).bin).model().build_info
    model = {kv.key: kv.value for kv in info.model_parameters}
    assert model["debug_mode"] == "dump_all_layers_output" and "layer_out_dump" not in model
    assert {kv.key: kv.value for kv in info.calibration_parameters}["quant_config"] == \
        '{"model_config": {"all_node_type": "int16"}}'
    keys = {kv.key for kv in info.input_parameters[0].params}
    assert "input_batch" in keys and not keys & {"input_layout_rt", "input_layout_train"}
    assert {kv.key for kv in info.deps} >= {"hb_compile version"}


def test_a_refusal_is_logged_in_hb_compile_log(tmp_path):
    cfg = tiny_project(tmp_path)
    doc = yaml.safe_load(open(cfg))
    doc["compiler_parameters"]["optimize_level"] = "O3"
    yaml.safe_dump(doc, open(cfg, "w"))
    run = hb_compile(tmp_path, "-c", "config.yaml")
    assert run.returncode != 0
    assert "ERROR optimize_level O3 (compiler_parameters) is not supported on nash-e" in (tmp_path / "hb_compile.log").read_text()


def test_hb_mapper_points_a_j6_march_to_hb_compile(tmp_path):
    conv_model(str(tmp_path / "m.onnx"))
    run = subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_mapper", "makertbin", "--fast-perf", "--model", "m.onnx",
                          "--model-type", "onnx", "--march", "nash-h"], cwd=str(tmp_path), capture_output=True, text=True)
    assert run.returncode != 0 and "hb_compile --fast-perf --model FILE --march nash-h" in run.stderr
    cfg = tiny_project(tmp_path)
    run = subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_mapper", "makertbin", "-c", cfg, "--model-type", "onnx"],
                         cwd=str(tmp_path), capture_output=True, text=True)
    assert run.returncode != 0 and "convert with hb_compile" in run.stderr


@pytest.mark.parametrize("march_name,tail", [("nash-e", "int32"), ("nash-m", "int32"), ("nash-b", "float32"),
                                             ("nash-h", "float32"), ("nash-p", "float32")])
def test_output_data_type_of_an_unquantized_tail_conv_is_the_marchs_tail_type(march_name, tail):
    """A model-tail Conv the quantized model leaves without a QuantizeLinear outputs at high accuracy:
    the node table says int32 on nash-e/m and float32 on nash-b/h/p; a Conv followed by one says its type."""
    from onnx import TensorProto, helper, numpy_helper

    from bpuemu.common.march import march
    from bpuemu.host.compiler.placement import place
    from bpuemu.host.convert.nodetable import model_output_dtypes

    w = numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "w")
    inits = [w, numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    vi = lambda n, shape: helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)  # noqa: E731
    float_graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["mid"], name="conv_a"),
                                     helper.make_node("Conv", ["mid", "w2"], ["y"], name="conv_tail")], "f",
                                    [vi("x", [1, 3, 4, 4])], [vi("y", [1, 2, 4, 4])],
                                    [w, numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w2")])
    float_model = helper.make_model(float_graph, opset_imports=[helper.make_opsetid("", 13)])
    q = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_in"),
         helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_in"),
         helper.make_node("Conv", ["xd", "w"], ["mid"], name="conv_a"),
         helper.make_node("QuantizeLinear", ["mid", "s", "z"], ["midq"], name="q_mid"),
         helper.make_node("DequantizeLinear", ["midq", "s", "z"], ["midd"], name="dq_mid"),
         helper.make_node("Conv", ["midd", "w2"], ["y"], name="conv_tail")]
    quantized = helper.make_model(helper.make_graph(q, "q", [vi("x", [1, 3, 4, 4])], [vi("y", [1, 2, 4, 4])],
                                                    inits + [numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w2")]),
                                  opset_imports=[helper.make_opsetid("", 13)])
    dtypes = model_output_dtypes(place(float_model, quantized_inputs=["x"]), quantized, march(march_name))
    assert dtypes == {"conv_a": "int8", "conv_tail": tail}
