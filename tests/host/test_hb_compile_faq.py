"""The J6 FAQ's conversion answers (ptq_faq_j6), each built from the FAQ's own example:
multi-batch models, multi-input order, dump_all_layers_output, output_nodes, and the layout kept."""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from j6_helpers import cal_dir, conv_model, write_yaml
from onnx import TensorProto, helper, numpy_helper

from bpuemu.board.runtime import FOLLOW_MODEL, Runtime
from bpuemu.common.container import read_bc, read_bin
from bpuemu.host.mapper.hb_compile import compile_from_config
from bpuemu.host.onnxgraph import open_session


def hb_compile(cwd, *args):
    return subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_compile", *args], cwd=str(cwd),
                          capture_output=True, text=True, timeout=300)


def _input_group(log: str):
    """{input name: {key: value}} of the input_parameters info group in hb_compile.log."""
    groups, cur = {}, None
    for line in log.splitlines():
        m = re.search(r"---------input info : (\S+) ---------", line)
        if m:
            cur = groups.setdefault(m.group(1), {})
        elif cur is not None and " end -------" in line:
            cur = None
        elif cur is not None and " : " in line or (cur is not None and ": " in line):
            k, v = line.split(" INFO ", 1)[1].split(":", 1)
            cur[k.strip()] = v.strip()
    return groups


# --- How to compile to get a multi-batch model? ---------------------------------------------------

def _project(tmp_path, model_shape, input_shape=None, input_batch=None, cal_shape=None):
    path = conv_model(str(tmp_path / "m.onnx"), shape=model_shape)
    cal = cal_dir(str(tmp_path), {"data": cal_shape or model_shape})
    extra = {"input_batch": input_batch} if input_batch else {}
    inp = {"cal_data_dir": cal["data"]}
    if input_shape:
        inp["input_shape"] = input_shape
    return write_yaml(str(tmp_path / "config.yaml"), path, inputs={"data": inp}, input_extra=extra)


def _dynamic(path: str) -> None:
    """The model's batch dimension made dynamic (?x3x8x8), as a dynamic-axes export has it."""
    m = onnx.load(path)
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].dim_param = "batch_size"
    onnx.save(m, path)


def test_non_dynamic_model_with_first_dimension_1_takes_input_batch(tmp_path):
    _project(tmp_path, (1, 3, 8, 8), input_batch=4)
    run = hb_compile(tmp_path, "-c", "config.yaml")
    assert run.returncode == 0, run.stderr
    hbm = read_bin(tmp_path / "model_output" / "tiny.hbm").model()
    assert list(hbm.inputs[0].valid_shape) == [4, 3, 8, 8] and list(hbm.outputs[0].valid_shape)[0] == 4
    info = _input_group((tmp_path / "hb_compile.log").read_text())["data"]
    assert (info["input_shape"], info["input_batch"]) == ("1x3x8x8", "4")
    # the ONNX artifacts keep batch 1, the calibration data is 1x3x8x8
    ptq = onnx.load(str(tmp_path / "model_output" / "tiny_ptq_model.onnx"))
    assert ptq.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1


def test_non_dynamic_model_with_first_dimension_not_1_refuses_input_batch(tmp_path):
    _project(tmp_path, (2, 3, 8, 8), input_batch=4)
    run = hb_compile(tmp_path, "-c", "config.yaml")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "input_batch 4 can only be used when the first dimension of input_shape is 1" in run.stderr


def test_dynamic_model_needs_input_shape(tmp_path):
    _project(tmp_path, (1, 3, 8, 8))
    _dynamic(str(tmp_path / "m.onnx"))
    run = hb_compile(tmp_path, "-c", "config.yaml")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "has the dynamic shape ?x3x8x8" in run.stderr and "set input_shape" in run.stderr


def test_dynamic_model_with_input_shape_1_takes_input_batch(tmp_path):
    _project(tmp_path, (1, 3, 8, 8), input_shape="1x3x8x8", input_batch=2)
    _dynamic(str(tmp_path / "m.onnx"))
    assert hb_compile(tmp_path, "-c", "config.yaml").returncode == 0
    assert list(read_bin(tmp_path / "model_output" / "tiny.hbm").model().inputs[0].valid_shape) == [2, 3, 8, 8]
    info = _input_group((tmp_path / "hb_compile.log").read_text())["data"]
    assert (info["input_shape"], info["input_batch"]) == ("1x3x8x8", "2")


def test_dynamic_model_with_input_shape_4_is_a_multi_batch_model(tmp_path):
    """input_shape 4x3x8x8: each calibration sample is 4x3x8x8, and input_batch cannot be used."""
    _project(tmp_path, (1, 3, 8, 8), input_shape="4x3x8x8", cal_shape=(4, 3, 8, 8))
    _dynamic(str(tmp_path / "m.onnx"))
    run = hb_compile(tmp_path, "-c", "config.yaml")
    assert run.returncode == 0, run.stderr
    assert list(read_bin(tmp_path / "model_output" / "tiny.hbm").model().inputs[0].valid_shape) == [4, 3, 8, 8]
    info = _input_group((tmp_path / "hb_compile.log").read_text())["data"]
    assert (info["input_shape"], info["input_batch"]) == ("4x3x8x8", "1")
    _project(tmp_path, (1, 3, 8, 8), input_shape="4x3x8x8", input_batch=2, cal_shape=(4, 3, 8, 8))
    _dynamic(str(tmp_path / "m.onnx"))
    assert "first dimension of input_shape is 1" in hb_compile(tmp_path, "-c", "config.yaml").stderr


# --- Is it normal for the order of model inputs to change during the conversion of a multi-input model? ---

def _three_inputs(path: str) -> None:
    """input3, input1, input2 (in this order; 1, 3 and 2 channels) -> Concat -> Conv."""
    chans = {"input3": 1, "input1": 3, "input2": 2}
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (4, 6, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Concat", list(chans), ["cat"], name="concat", axis=1),
             helper.make_node("Conv", ["cat", "w"], ["out"], name="conv", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "three", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, 8, 8])
                                           for n, c in chans.items()],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)


def test_multi_input_order_hbm_by_name_and_tools_address_inputs_by_name(tmp_path):
    path = str(tmp_path / "three.onnx")
    _three_inputs(path)
    shapes = {"input3": (1, 1, 8, 8), "input1": (1, 3, 8, 8), "input2": (1, 2, 8, 8)}
    cal = cal_dir(str(tmp_path), shapes)
    write_yaml(str(tmp_path / "config.yaml"), path, prefix="three", inputs={n: {"cal_data_dir": cal[n]} for n in shapes})
    assert hb_compile(tmp_path, "-c", "config.yaml").returncode == 0
    out = tmp_path / "model_output"
    # the float model's order: input3, input1, input2; the .bc keeps it, the .hbm orders inputs by name
    assert list(read_bc(out / "three_quantized_model.bc").manifest.input_names) == ["input3", "input1", "input2"]
    hbm = read_bin(out / "three.hbm").model()
    assert [p.name for p in hbm.inputs] == ["input1", "input2", "input3"]
    # hb_model_info shows it in its input_parameters info group
    info = subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_model_info", str(out / "three.hbm")],
                          capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert re.findall(r"---------input info : (\S+) ---------", info.stdout) == ["input1", "input2", "input3"]
    # by name, the .hbm computes what the ptq model computes
    rng = np.random.default_rng(5)
    feed = {n: rng.normal(0, 1, s).astype(np.float32) for n, s in shapes.items()}
    rt = Runtime(march=FOLLOW_MODEL)
    rt.load([str(out / "three.hbm")])
    got = rt.model().run(feed)[0]
    ref = open_session(onnx.load(str(out / "three_ptq_model.onnx"))).run(None, feed)[0]
    assert np.array_equal(got, ref)


# --- How to dump model middle tier output? ---------------------------------------------------------

def _conv_matmul(tmp_path) -> str:
    path = conv_model(str(tmp_path / "cm.onnx"), matmul=True)
    m = onnx.load(path)
    m.graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    m.graph.node.append(helper.make_node("Mul", ["mm", "half"], ["out"], name="tail_mul"))
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 2, 5]))
    onnx.save(m, path)
    return path


@pytest.mark.parametrize("debug_mode", [None, "dump_all_layers_output"])
def test_dump_all_layers_output_adds_a_dequantized_output_after_each_conv_and_matmul(tmp_path, debug_mode):
    path = _conv_matmul(tmp_path)
    cal = cal_dir(str(tmp_path), {"data": (1, 3, 8, 8)})
    write_yaml(str(tmp_path / "config.yaml"), path, inputs={"data": {"cal_data_dir": cal["data"]}},
               model_extra={"debug_mode": debug_mode} if debug_mode else {})
    art = compile_from_config(str(tmp_path / "config.yaml"))
    hbm = read_bin(art.bin).model()
    names = [o.name for o in hbm.outputs]
    if debug_mode is None:
        assert names == ["out"]
        return
    assert names[0] == "out" and sorted(names[1:]) == ["conv1_layer_out", "conv2_layer_out", "matmul_layer_out"]
    assert [o.name for o in onnx.load(art.quantized).graph.output] == ["out"]   # the ptq model is not changed
    rt = Runtime(march=FOLLOW_MODEL)
    rt.load([art.bin])
    outs = dict(zip(names, rt.model().run({"data": np.ones((1, 3, 8, 8), np.float32)})))
    assert outs["conv1_layer_out"].shape == (1, 4, 8, 8) and outs["conv1_layer_out"].dtype == np.float32
    assert outs["matmul_layer_out"].shape == (1, 2, 5)


# --- output_nodes ----------------------------------------------------------------------------------

def test_output_nodes_makes_a_node_an_output(tmp_path):
    path = conv_model(str(tmp_path / "m.onnx"), relu_tail=True)
    cal = cal_dir(str(tmp_path), {"data": (1, 3, 8, 8)})
    write_yaml(str(tmp_path / "config.yaml"), path, inputs={"data": {"cal_data_dir": cal["data"]}},
               model_extra={"output_nodes": "relu1"})
    art = compile_from_config(str(tmp_path / "config.yaml"))
    assert [o.name for o in read_bin(art.bin).model().outputs] == ["r1"]
    assert [r["Node"] for r in art.node_rows] == ["conv1", "relu1"]


# --- How to modify the input layout of the model? --------------------------------------------------

FAQ_SNIPPET = textwrap.dedent('''\
    import onnx

    onnx_model = onnx.load('./model.onnx')
    graph = onnx_model.graph

    new_node = onnx.helper.make_node(         # Create Transpose node
              "Transpose",
              inputs = ["data"],            # New input node name, customization
              outputs = ["data_oringal"],   # Original input node name
              perm = [0, 3, 1, 2],          # NHWC-->NCHW
    )
    graph.node.insert(0, new_node)            # Insert Transpose at the very front of the model

    d = graph.input[0].type.tensor_type.shape.dim    # Configure new model inputs, NHWC
    d[0].dim_value = 1
    d[1].dim_value = 224
    d[2].dim_value = 224
    d[3].dim_value = 6

    onnx_model.graph.input[0].name = f"data"    # Configure the model input name
    onnx.checker.check_model(onnx_model)        # Model check
    onnx.save(onnx_model, "new_model.onnx")     # Save the new model
    ''')


def test_the_faqs_transpose_snippet_yields_a_model_that_converts_with_its_layout_kept(tmp_path):
    # a small NCHW model whose input is the snippet's "data_oringal", 1x6x224x224
    conv_model(str(tmp_path / "model.onnx"), shape=(1, 6, 224, 224), input_name="data_oringal")
    (tmp_path / "faq_layout.py").write_text(FAQ_SNIPPET)
    subprocess.run([sys.executable, "faq_layout.py"], cwd=str(tmp_path), check=True, timeout=120)
    nhwc = (1, 224, 224, 6)
    cal = cal_dir(str(tmp_path), {"data": nhwc}, samples=2)
    write_yaml(str(tmp_path / "config.yaml"), "new_model.onnx", prefix="nhwc", inputs={"data": {"cal_data_dir": cal["data"]}})
    run = hb_compile(tmp_path, "-c", "config.yaml")
    assert run.returncode == 0, run.stderr
    out = tmp_path / "model_output"
    hbm = read_bin(out / "nhwc.hbm").model()
    assert list(hbm.inputs[0].valid_shape) == list(nhwc)   # the ONNX layout is kept
    for artifact in ("nhwc_original_float_model.onnx", "nhwc_ptq_model.onnx"):
        dims = onnx.load(str(out / artifact)).graph.input[0].type.tensor_type.shape.dim
        assert [d.dim_value for d in dims] == list(nhwc)


def test_an_nhwc_image_model_keeps_its_layout(tmp_path):
    """input_type_train rgb on a model whose input is NHWC: hb_compile reads the layout from the model."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Transpose", ["img"], ["nchw"], name="to_nchw", perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["nchw", "w"], ["out"], name="conv", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "nhwc", [helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 8, 8, 3])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "nhwc.onnx"))
    cal = os.path.join(str(tmp_path), "cal_rgb")
    os.makedirs(cal)
    for i in range(2):
        rng.integers(0, 255, (1, 8, 8, 3), dtype=np.uint8).tofile(os.path.join(cal, f"{i}.rgb"))
    write_yaml(str(tmp_path / "config.yaml"), "nhwc.onnx", prefix="img",
               inputs={"img": {"input_type_train": "rgb", "input_type_rt": "rgb", "norm_type": "no_preprocess",
                               "cal_data_dir": cal}},
               calibration={"cal_data_type": "uint8"})
    art = compile_from_config(str(tmp_path / "config.yaml"))
    hbm = read_bin(art.bin).model()
    assert hbm.input_specs[0].model_layout == "NHWC" and hbm.input_specs[0].input_layout_rt == "NHWC"
    assert list(hbm.inputs[0].valid_shape) == [1, 8, 8, 3]
    dims = onnx.load(art.original).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, 8, 8, 3]
