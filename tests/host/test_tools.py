"""hb_model_info, hb_pack and hb_model_modifier on `.bin` files made by hb_mapper makertbin.

The tools run through their real entry points (``main`` with the CLI edge ``bpuemu.board.cli.run``,
so exit codes and the one-line errors are what a user sees); the modified and
packed files are loaded by the real runtime (bpuemu.board.runtime.Runtime)
and by hrt_model_exec, and compared with the originals bit for bit.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bpuemu.board.runtime import Runtime
from bpuemu.common.container import read_bin, write_bin
from bpuemu.common.proto import model_pb2
from bpuemu.common.version import __version__
from bpuemu.host.compiler import modifier
from bpuemu.host.tools import pack
from bpuemu.host.cli import hb_model_info as info_cli
from bpuemu.host.cli import hb_model_modifier as modifier_cli
from bpuemu.host.cli import hb_pack as pack_cli
import tools_models

TT = model_pb2.TensorType


@pytest.fixture(scope="module")
def bins(tmp_path_factory):
    return tools_models.build_all(str(tmp_path_factory.mktemp("tools_bins")))


run_tool = tools_models.run_tool


def run_model(path, name=None, inputs=None, seed=0):
    rt = Runtime()
    rt.load([path])
    m = rt.model(name)
    inputs = inputs if inputs is not None else tools_models.random_inputs(m.model, seed)
    return m, m.run(inputs)


def dequantize(q: np.ndarray, props: model_pb2.TensorProperties) -> np.ndarray:
    """(q - zero_point) * scale with the reported properties, as a user's own dequantize does it."""
    scale = np.asarray(props.scale_data, np.float32)
    zp = np.asarray(props.zero_point_data, np.int32)
    if scale.size > 1:
        shape = [1] * q.ndim
        shape[props.quantize_axis] = scale.size
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (q.astype(np.int32) - zp).astype(np.float32) * scale


def quantize(x: np.ndarray, props: model_pb2.TensorProperties) -> np.ndarray:
    """The seed's Quantize formula: clamp(round(x / scale) + zero_point, -128, 127)."""
    scale = np.float32(props.scale_data[0])
    return np.clip(np.rint(x / scale) + props.zero_point_data[0], -128, 127).astype(np.int8)


# --- hb_model_info -----------------------------------------------------------------------

def test_model_info_prints_the_seed_sections_from_the_manifest(bins, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_tool(info_cli.main, [bins["fm"]], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:3] == ["Start hb_model_info....", f"hb_model_info version {__version__}", "******** fm info *********"]
    headers = ["############# model deps info #############", "############# model_parameters info #############",
               "############# input_parameters info #############", "---------input info : data ---------",
               "---------input info : data end -------", "############# calibration_parameters info #############",
               "############# compiler_parameters info #############", "--------- input/output types -"]
    assert [line for line in lines if line in headers] == headers
    assert f"hb_mapper version   : {__version__}" in lines
    assert "output_model_file_prefix: fm" in lines
    assert "input_type_rt       : featuremap" in lines
    assert "input_shape         : 1x3x32x32" in lines
    assert "calibration_type    : max" in lines
    assert "hbdk_pass_through_params: --fast --O3 --debug" in lines
    assert "model input types   : [<InputDataType.F32: 5>]" in lines
    assert lines[-1] == "model output types  : [<InputDataType.F32: 5>]"
    assert "deleted nodes" not in out
    assert not (tmp_path / "deleted_nodes_info.txt").exists()


def test_model_info_image_input_type_and_version(bins, capsys):
    code, out, _ = run_tool(info_cli.main, [bins["image"]], capsys)
    assert code == 0
    assert "model input types   : [<InputDataType.NV12: 7>]" in out.splitlines()
    assert "input_type_rt       : nv12" in out.splitlines()
    code, out, _ = run_tool(info_cli.main, ["--version"], capsys)
    assert code == 0 and __version__ in out and "hb_model_info" in out


def test_model_info_json(bins, capsys):
    code, out, _ = run_tool(info_cli.main, [bins["residual"], "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["packed"] is False
    assert [m["name"] for m in doc["models"]] == ["residual"]
    assert doc["models"][0]["input_parameters"]["x"]["input_type_rt"] == "featuremap"


def test_model_info_errors_are_one_line(tmp_path, capsys):
    code, _, err = run_tool(info_cli.main, [tmp_path / "missing.bin"], capsys)
    assert code != 0 and err.strip().splitlines() == [f"ERROR model file not found: {tmp_path / 'missing.bin'}"]
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a model at all, just bytes" * 4)
    code, _, err = run_tool(info_cli.main, [bad], capsys)
    assert code != 0 and err.startswith("ERROR ") and "not a bpuemu .bin model" in err and "Traceback" not in err


# --- hb_pack ---------------------------------------------------------------------------------

def test_pack_keeps_names_and_the_runtime_runs_each_model_bit_exactly(bins, tmp_path, capsys):
    out = tmp_path / "comb.bin"
    code, _, err = run_tool(pack_cli.main, [bins["fm"], bins["residual"], bins["image"], "-o", out], capsys)
    assert code == 0, err
    packed = read_bin(out)
    assert packed.manifest.packed is True
    assert packed.model_names == ["fm", "residual", "image"]
    # every blob renamed after its model, every step pointing at its own model's blobs
    for m in packed.manifest.models:
        for step in m.plan:
            if step.blob:
                assert step.blob.startswith(f"{m.name}__") and step.blob in packed.blobs
    rt = Runtime()
    assert rt.load([out]) == ["fm", "residual", "image"]
    for name in ("fm", "residual", "image"):
        alone, expect = run_model(bins[name], seed=3)
        got = rt.model(name).run(tools_models.random_inputs(alone.model, 3))
        assert len(got) == len(expect)
        for a, b in zip(got, expect):
            assert a.dtype == b.dtype and np.array_equal(a, b)


def test_hrt_model_exec_picks_a_model_of_a_packed_file(bins, tmp_path):
    from click.testing import CliRunner
    from bpuemu.board.cli.hrt_model_exec import cli as hrt

    out = tmp_path / "comb.bin"
    pack.pack_files([bins["fm"], bins["residual"]], str(out))
    r = CliRunner().invoke(hrt, ["model_info", "--model_file", str(out)])
    assert r.exit_code == 0, r.output
    assert "This model file has 2 model:" in r.output and "[fm]" in r.output and "[residual]" in r.output
    r = CliRunner().invoke(hrt, ["infer", "--model_file", str(out), "--model_name", "residual"])
    assert r.exit_code == 0, r.output
    assert "infer success: model residual" in r.output


def test_pack_refuses_a_packed_model_with_the_seed_message(bins, tmp_path, capsys):
    comb = tmp_path / "comb.bin"
    pack.pack_files([bins["fm"], bins["residual"]], str(comb))
    again = tmp_path / "again.bin"
    code, _, err = run_tool(pack_cli.main, [comb, bins["image"], "-o", again], capsys)
    assert code != 0
    assert err.splitlines() == ["ERROR exception in command: pack",
                                f"ERROR model: {comb} is a packed model, it can not be packed again!"]
    assert not again.exists()


def test_pack_refuses_duplicate_model_names_and_a_single_model(bins, tmp_path, capsys):
    code, _, err = run_tool(pack_cli.main, [bins["fm"], bins["fm"], "-o", tmp_path / "x.bin"], capsys)
    assert code != 0 and "model name 'fm' is in both" in err
    code, _, err = run_tool(pack_cli.main, [bins["fm"], "-o", tmp_path / "x.bin"], capsys)
    assert code != 0 and "at least two models" in err
    assert not (tmp_path / "x.bin").exists()


def test_tools_work_on_sample_bin_models_too(bins, tmp_path, capsys):
    """host/samples.py's stand-in `.bin` (partial BuildInfo) packs and reports like a makertbin one."""
    from bpuemu.host.samples import sample_bin

    sample = tmp_path / "sample.bin"
    sample_bin(str(sample), "rgb", height=16, width=16, name="sample")
    comb = tmp_path / "comb.bin"
    code, _, err = run_tool(pack_cli.main, [sample, bins["residual"], "-o", comb], capsys)
    assert code == 0, err
    code, out, _ = run_tool(info_cli.main, [comb, "-m", "sample"], capsys)
    assert code == 0
    assert "******** sample info *********" in out and "model input types   : [<InputDataType.RGB: 10>]" in out
    alone, expect = run_model(str(sample), seed=5)
    _, got = run_model(str(comb), "sample", tools_models.random_inputs(alone.model, 5))
    assert np.array_equal(got[0], expect[0])


def test_model_info_on_a_packed_file(bins, tmp_path, capsys):
    comb = tmp_path / "comb.bin"
    pack.pack_files([bins["fm"], bins["image"]], str(comb))
    code, out, _ = run_tool(info_cli.main, [comb], capsys)
    assert code == 0
    assert "******** fm info *********" in out and "******** image info *********" in out
    code, out, _ = run_tool(info_cli.main, [comb, "-m", "image"], capsys)
    assert code == 0
    assert "******** image info *********" in out and "******** fm info *********" not in out
    assert out.count("Start hb_model_info....") == 1
    code, _, err = run_tool(info_cli.main, [comb, "-m", "nope"], capsys)
    assert code != 0 and "model 'nope' is not in" in err and "fm, image" in err


# --- hb_model_modifier -----------------------------------------------------------------------

def test_modifier_lists_the_removable_nodes(bins, capsys):
    code, _, err = run_tool(modifier_cli.main, [bins["residual"]], capsys)
    assert code == 0
    assert err.rstrip().endswith(
        "INFO Nodes that can be deleted: ['x_QuantizeLinear_HzQuantize', 'y_DequantizeLinear_HzDequantize']")
    code, _, err = run_tool(modifier_cli.main, [bins["fm"]], capsys)
    assert err.rstrip().endswith("INFO Nodes that can be deleted: ['data_QuantizeLinear_HzQuantize', 'Softmax_prob']")
    # the nv12 model has no input quantize: Preprocess feeds the BPU subgraph directly
    code, _, err = run_tool(modifier_cli.main, [bins["image"]], capsys)
    assert err.rstrip().endswith("INFO Nodes that can be deleted: ['Softmax_prob']")


def test_removing_the_dequantize_leaves_the_raw_int8_output_that_its_scale_restores(bins, tmp_path, capsys,
                                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_tool(modifier_cli.main, [bins["residual"], "-r", "y_DequantizeLinear_HzDequantize"], capsys)
    assert code == 0, err
    assert out.splitlines() == ["Node 'y_DequantizeLinear_HzDequantize' found, its OP type is 'Dequantize'",
                                "Node 'y_DequantizeLinear_HzDequantize' is removed",
                                "modified model saved as residual_modified.bin"]
    modified = tmp_path / "residual_modified.bin"
    m = read_bin(modified).model()
    props = m.outputs[0]
    assert props.name == "y"                                   # the output keeps its name
    assert props.tensor_type == TT.HB_DNN_TENSOR_TYPE_S8 and props.quanti_type == model_pb2.SCALE
    assert len(props.scale_data) == 1 and props.scale_data[0] > 0 and len(props.zero_point_data) == 1
    assert list(m.build_info.deleted_nodes) == ["y_DequantizeLinear_HzDequantize"]
    assert "y_DequantizeLinear_HzDequantize" not in [s.name for s in m.plan]

    orig_model, (y,) = run_model(bins["residual"])
    _, (q,) = run_model(str(modified))
    assert q.dtype == np.int8 and q.shape == y.shape
    assert y.dtype == np.float32 and not np.array_equal(q.astype(np.float32), y)
    assert np.array_equal(dequantize(q, props), y)             # bit-exact: DequantizeStep is the same formula


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_dequantize_removal_with_zero_points_and_per_channel_scales(tmp_path, per_channel):
    """makertbin's activations are symmetric (zero point 0); a QDQ model from onnxruntime's quantizer with
    asymmetric activations (and, per channel, an axis-1 output Dequantize) checks zero point and axis."""
    from helpers import models as M

    q = M.quantize_qdq(M.residual_model(), per_channel=True)
    if per_channel:
        q = M.per_channel_output_dequantize(q, "y")
    case = M.build_case(tmp_path, M.residual_model(), "asym", per_channel=True, qmodel=q)
    dq = next(s for s in case.model.plan if s.kind == model_pb2.PlanStep.DEQUANTIZE)
    assert any(z != 0 for z in dq.zero_point) and (len(dq.scale) > 1) == per_channel
    new, blobs, _ = modifier.modify_file(read_bin(case.path), types=["Dequantize"])
    path = tmp_path / "asym_modified.bin"
    write_bin(path, [new], blobs)
    props = new.outputs[0]
    assert list(props.zero_point_data) == list(dq.zero_point)
    assert props.quantize_axis == (1 if per_channel else -1) and len(props.scale_data) == len(dq.scale)
    x = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype(np.float32)
    _, (y,) = run_model(case.path, inputs=[x])
    _, (q8,) = run_model(str(path), inputs=[x])
    assert q8.dtype == np.int8
    assert np.array_equal(dequantize(q8, props), y)
    # then the input Quantize: the application quantizes with the reported (asymmetric) parameters
    both, blobs2, _ = modifier.modify(new, blobs, types=["Quantize"])
    path2 = tmp_path / "asym_both.bin"
    write_bin(path2, [both], blobs2)
    qin = both.inputs[0]
    assert qin.zero_point_data[0] != 0 and qin.tensor_type == TT.HB_DNN_TENSOR_TYPE_S8
    _, (q8b,) = run_model(str(path2), inputs=[quantize(x, qin)])
    assert np.array_equal(q8b, q8)


def test_hrt_model_exec_shows_and_returns_the_modified_output(bins, tmp_path):
    from click.testing import CliRunner
    from bpuemu.board.cli.hrt_model_exec import cli as hrt

    binfile = read_bin(bins["residual"])
    new, blobs, removed = modifier.modify_file(binfile, names=["y_DequantizeLinear_HzDequantize"])
    path = tmp_path / "r.bin"
    write_bin(path, [new], blobs)
    r = CliRunner().invoke(hrt, ["model_info", "--model_file", str(path)])
    assert r.exit_code == 0, r.output
    block = r.output.split("output[0]:")[1]
    assert "name: y" in block and "tensor type: HB_DNN_TENSOR_TYPE_S8" in block and "quanti type: SCALE" in block
    assert f"scale data: {removed[0].info['scale'][0]:g}," in block
    r = CliRunner().invoke(hrt, ["infer", "--model_file", str(path)])
    assert r.exit_code == 0, r.output
    assert "output[0]: name: y, shape: [1, 8, 16, 16], dtype: int8" in r.output


def test_removing_the_input_quantize_makes_the_featuremap_input_int8(bins, tmp_path, capsys):
    out = tmp_path / "q.bin"
    code, _, err = run_tool(modifier_cli.main, [bins["residual"], "-a", "Quantize", "-o", out], capsys)
    assert code == 0, err
    m = read_bin(out).model()
    props = m.inputs[0]
    assert props.name == "x" and props.tensor_type == TT.HB_DNN_TENSOR_TYPE_S8
    assert props.quanti_type == model_pb2.SCALE and list(props.valid_shape) == [1, 3, 16, 16]
    assert m.input_specs[0].model_dtype == "int8"
    orig, (y,) = run_model(bins["residual"])
    x = tools_models.random_inputs(orig.model)[0]
    _, (y2,) = run_model(str(out), inputs=[quantize(x, props)])
    assert np.array_equal(y2, y)
    # a float input is now refused with a clear message
    with pytest.raises(Exception, match="must be int8"):
        run_model(str(out), inputs=[x])


def test_softmax_then_dequantize_are_removed_bottom_up(bins, tmp_path, capsys):
    step1 = tmp_path / "s1.bin"
    code, _, _ = run_tool(modifier_cli.main, [bins["fm"], "-r", "logits_DequantizeLinear_HzDequantize", "-o", step1],
                          capsys)
    assert code != 0                                          # not a node yet: the Softmax piece holds it
    assert not step1.exists()
    code, out, err = run_tool(modifier_cli.main, [bins["fm"], "-r", "Softmax_prob", "-o", step1], capsys)
    assert code == 0, err
    assert "Node 'Softmax_prob' found, its OP type is 'Softmax'" in out
    code, _, err = run_tool(modifier_cli.main, [step1], capsys)
    assert "Nodes that can be deleted: ['data_QuantizeLinear_HzQuantize', 'logits_DequantizeLinear_HzDequantize']" in err
    m1 = read_bin(step1).model()
    assert m1.outputs[0].name == "prob" and m1.outputs[0].tensor_type == TT.HB_DNN_TENSOR_TYPE_F32

    orig, (prob,) = run_model(bins["fm"])
    _, (logits,) = run_model(str(step1))
    e = np.exp(logits.astype(np.float64) - logits.max())
    np.testing.assert_allclose(e / e.sum(), prob, rtol=1e-5, atol=1e-6)   # what the removed Softmax computed

    step2 = tmp_path / "s2.bin"
    code, _, err = run_tool(modifier_cli.main, [step1, "-r", "logits_DequantizeLinear_HzDequantize", "-o", step2],
                            capsys)
    assert code == 0, err
    m2 = read_bin(step2).model()
    assert list(m2.build_info.deleted_nodes) == ["Softmax_prob", "logits_DequantizeLinear_HzDequantize"]
    _, (q,) = run_model(str(step2))
    assert q.dtype == np.int8
    assert np.array_equal(dequantize(q, m2.outputs[0]), logits)

    # -a with both types does the same in one run, whatever the order given
    both = tmp_path / "both.bin"
    code, _, _ = run_tool(modifier_cli.main, [bins["fm"], "-a", "Dequantize", "-a", "Softmax", "-o", both], capsys)
    assert code == 0
    assert list(read_bin(both).model().build_info.deleted_nodes) == list(m2.build_info.deleted_nodes)


def test_input_transpose_then_quantize_top_down(bins, tmp_path, capsys):
    code, _, err = run_tool(modifier_cli.main, [bins["transpose_in"]], capsys)
    assert err.rstrip().endswith("Nodes that can be deleted: ['Transpose_in', 'y_DequantizeLinear_HzDequantize']")
    t = tmp_path / "t.bin"
    code, out, err = run_tool(modifier_cli.main, [bins["transpose_in"], "-r", "Transpose_in", "-o", t], capsys)
    assert code == 0, err
    assert "its OP type is 'Transpose'" in out
    m = read_bin(t).model()
    assert list(m.inputs[0].valid_shape) == [1, 3, 8, 8]      # the application now feeds NCHW
    assert m.inputs[0].tensor_layout == model_pb2.HB_DNN_LAYOUT_NCHW
    quant_name = next(s.name for s in m.plan if s.kind == model_pb2.PlanStep.QUANTIZE)
    code, _, err = run_tool(modifier_cli.main, [t], capsys)
    assert f"'{quant_name}'" in err

    orig, (y,) = run_model(bins["transpose_in"])
    x_nhwc = tools_models.random_inputs(orig.model)[0]
    x_nchw = np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2))
    _, (y1,) = run_model(str(t), inputs=[x_nchw])
    assert np.array_equal(y1, y)

    tq = tmp_path / "tq.bin"
    code, _, err = run_tool(modifier_cli.main, [t, "-r", quant_name, "-o", tq], capsys)
    assert code == 0, err
    m2 = read_bin(tq).model()
    assert m2.inputs[0].tensor_type == TT.HB_DNN_TENSOR_TYPE_S8 and m2.inputs[0].quanti_type == model_pb2.SCALE
    _, (y2,) = run_model(str(tq), inputs=[quantize(x_nchw, m2.inputs[0])])
    assert np.array_equal(y2, y)


def test_output_reshape_then_dequantize(bins, tmp_path, capsys):
    r = tmp_path / "r.bin"
    code, out, err = run_tool(modifier_cli.main, [bins["reshape_out"], "-r", "Reshape_out", "-o", r], capsys)
    assert code == 0, err
    assert "its OP type is 'Reshape'" in out
    m = read_bin(r).model()
    assert m.outputs[0].name == "y" and list(m.outputs[0].valid_shape) == [1, 4, 8, 8]
    info = json.loads(m.build_info.deleted_nodes_info[0])
    assert info["name"] == "Reshape_out" and info["op_type"] == "Reshape" and info["shape"] == [1, 256]
    _, (y,) = run_model(bins["reshape_out"])
    _, (y4,) = run_model(str(r))
    assert np.array_equal(y4.reshape(1, 256), y)


def test_non_adjacent_nodes_are_refused(bins, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert [(c.name, c.side) for c in modifier.candidates(read_bin(bins["cpu_middle"]).model(),
                                                          read_bin(bins["cpu_middle"]).blobs)] == [
        ("x_QuantizeLinear_HzQuantize", "input"), ("Softmax_mid", ""), ("y_DequantizeLinear_HzDequantize", "output")]
    code, _, err = run_tool(modifier_cli.main, [bins["cpu_middle"], "-r", "Softmax_mid"], capsys)
    assert code != 0
    assert err.splitlines()[0] == ("ERROR node 'Softmax_mid' can not be removed: it is not adjacent to a model input "
                                   "or output (other nodes follow it)")
    assert "Traceback" not in err
    assert not list(tmp_path.iterdir())                        # nothing written


def test_modifier_refuses_packed_models_unknown_nodes_and_types(bins, tmp_path, capsys):
    comb = tmp_path / "comb.bin"
    pack.pack_files([bins["fm"], bins["residual"]], str(comb))
    code, _, err = run_tool(modifier_cli.main, [comb], capsys)
    assert code != 0 and err.splitlines() == ["ERROR pack model is not supported."]
    code, _, err = run_tool(modifier_cli.main, [bins["fm"], "-r", "no_such_node", "-o", tmp_path / "o.bin"], capsys)
    assert code != 0 and "node 'no_such_node' is not in model 'fm'" in err
    code, _, err = run_tool(modifier_cli.main, [bins["fm"], "-r", "BPU_fm_subgraph_0", "-o", tmp_path / "o.bin"], capsys)
    assert code != 0 and "compiled into a BPU subgraph" in err
    code, _, err = run_tool(modifier_cli.main, [bins["fm"], "-a", "Conv", "-o", tmp_path / "o.bin"], capsys)
    assert code != 0 and "unsupported node type(s) ['Conv']" in err
    assert not (tmp_path / "o.bin").exists()


def test_model_info_shows_deleted_nodes_and_writes_their_info(bins, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "m.bin"
    run_tool(modifier_cli.main, [bins["residual"], "-a", "Dequantize", "-a", "Quantize", "-o", out], capsys)
    code, text, _ = run_tool(info_cli.main, [out], capsys)
    assert code == 0
    lines = text.splitlines()
    i = lines.index("--------- deleted nodes -")
    assert lines[i + 1:i + 3] == ["deleted nodes: x_QuantizeLinear_HzQuantize",
                                  "deleted nodes: y_DequantizeLinear_HzDequantize"]
    assert "model input types   : [<InputDataType.S8: 1>]" in lines
    assert "model output types  : [<InputDataType.S8: 1>]" in lines
    recorded = [json.loads(line) for line in (tmp_path / "deleted_nodes_info.txt").read_text().splitlines()]
    m = read_bin(out).model()
    assert [r["name"] for r in recorded] == ["x_QuantizeLinear_HzQuantize", "y_DequantizeLinear_HzDequantize"]
    assert [r["op_type"] for r in recorded] == ["Quantize", "Dequantize"]
    assert recorded[1]["scale"] == pytest.approx(list(m.outputs[0].scale_data))
    assert recorded[1]["zero_point"] == list(m.outputs[0].zero_point_data)


def test_console_scripts_are_installed():
    for tool in ("hb_model_info", "hb_pack", "hb_model_modifier", "hb_perf"):
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), tool), "--version"],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert tool in proc.stdout and __version__ in proc.stdout
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "hb_model_modifier"), "/nonexistent.bin"],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == ["ERROR model file not found: /nonexistent.bin"]
