"""The seed's BPU operator examples (Pow as HzLut, ArgMax with C <= 64) and makertbin --fast-perf.

Pow and ArgMax: the checker's table says BPU, makertbin compiles them into a
BPU subgraph, and the board runtime agrees bit-exactly with quanti.onnx; past
a constraint (ArgMax over 65 channels, a Pow whose exponent is a tensor) they
fall back to the CPU with the reason. --fast-perf, run as a user types it,
leaves no Quantize/Dequantize/Transpose/Reshape at the model's beginning and
end (the plan and hb_model_info's deleted nodes say so).
"""
import logging
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bpuemu.board.runtime import Runtime
from bpuemu.common.container import read_bin
from bpuemu.common.input_types import random_rt_input, to_model_input
from bpuemu.common.proto import model_pb2
from bpuemu.host import HB_ONNXRuntime
from bpuemu.host.mapper.checker import check
from bpuemu.host.mapper.makertbin import FAST_PERF_REMOVED_TYPES, makertbin_from_config

from makertbin_helpers import write_cal_dir, write_config
from quant_models import POW_ARGMAX_SIZE, pow_argmax_model

Kind = model_pb2.PlanStep.Kind
SIZE = POW_ARGMAX_SIZE




def _convert(tmp_path, model: onnx.ModelProto, calibration_type: str = "max"):
    onnx.save(model, str(tmp_path / "float.onnx"))
    rng = np.random.default_rng(1)
    cal = write_cal_dir(str(tmp_path / "cal"), [rng.integers(0, 256, (1, 3, SIZE, SIZE), dtype=np.uint8) for _ in range(4)])
    inp = {"input_type_train": "rgb", "input_layout_train": "NCHW", "input_type_rt": "rgb", "input_layout_rt": "NHWC",
           "norm_type": "data_mean_and_scale", "mean_value": "128 128 128", "scale_value": "0.0078125",
           "input_shape": f"1x3x{SIZE}x{SIZE}", "cal_data_dir": cal, "cal_data_type": "uint8"}
    cfg = write_config(str(tmp_path / "config.yaml"), str(tmp_path / "float.onnx"), "pa", str(tmp_path / "out"),
                       {"data": inp}, calibration={"calibration_type": calibration_type})
    return makertbin_from_config(cfg)


def test_default_calibration_scores_an_argmax_output_at_the_float_tensor_it_reads(tmp_path, caplog):
    """A cosine of ArgMax indices means nothing: the search scores conv2's output instead."""
    with caplog.at_level(logging.INFO, logger="bpuemu.host.makertbin"):
        art = _convert(tmp_path, pow_argmax_model(), "default")
    tried = [m for m in caplog.messages if m.startswith("calibration method ")]
    assert tried and all(m.endswith("(integer output idx scored at its float input c2)") for m in tried)
    # measured at c2 max already reaches the 0.995 target (the indices' cosine stayed below it,
    # so the search went on to steps 2 and 3 and picked per-channel)
    assert len(tried) == 3 and "Select max method." in caplog.messages
    assert "Perchannel quantization is enabled." not in caplog.messages
    assert os.path.exists(art.bin)


def _checker_rows(path) -> dict:
    result = check(str(path), {})
    return {n.name: (n.on, n.bpu_type, n.reason) for n in result.placement.nodes}


def test_checker_puts_pow_and_argmax_on_the_bpu(tmp_path):
    onnx.save(pow_argmax_model(), str(tmp_path / "m.onnx"))
    rows = _checker_rows(tmp_path / "m.onnx")
    assert rows["pow"][:2] == ("BPU", "HzLut")
    assert rows["argmax"][:2] == ("BPU", "HzArgMax")


@pytest.mark.parametrize("model,node,reason", [
    (pow_argmax_model(channels=65), "argmax", "65 channels exceed 64"),
    (pow_argmax_model(exponent_input=True), "pow", "the exponent is not a constant scalar"),
])
def test_past_a_constraint_they_run_on_the_cpu(tmp_path, model, node, reason):
    onnx.save(model, str(tmp_path / "m.onnx"))
    on, bpu_type, why = _checker_rows(tmp_path / "m.onnx")[node]
    assert on == "CPU" and reason in why


def test_makertbin_compiles_pow_and_argmax_into_a_bpu_subgraph_bit_exact_with_quanti_onnx(tmp_path):
    art = _convert(tmp_path, pow_argmax_model())
    rt = Runtime()
    rt.load(art.bin)
    m = rt.model()
    (sub,) = [s for s in m.model.plan if s.kind == Kind.BPU_SUBGRAPH]
    assert {"pow", "argmax"} <= set(sub.source_nodes)
    assert not [s for s in m.model.plan if s.kind == Kind.CPU_OP]
    assert m.model.outputs[0].tensor_type == model_pb2.HB_DNN_TENSOR_TYPE_S64
    spec = m.model.input_specs[0]
    sess = HB_ONNXRuntime(art.quantized)
    for seed in range(4):
        x = random_rt_input(spec, np.random.default_rng(seed))
        got = m.run([x])[0]
        ref = sess.run(None, {"data": to_model_input(x, spec)})[0]
        assert got.dtype == np.int64 and np.array_equal(got, ref)
        assert got.min() >= 0 and got.max() < 8


def test_hb_perf_costs_pow_and_argmax_on_the_vector_unit(tmp_path):
    from bpuemu.host.tools import static_perf as perf

    art = _convert(tmp_path, pow_argmax_model())
    b = read_bin(art.bin)
    layers = {layer.name: layer for layer in perf.estimate_model(b.model(), b.blobs).subgraphs[0].layers}
    assert (layers["pow"].bpu_type, layers["pow"].unit, layers["pow"].ops) == ("HzLut", "vector", 8 * SIZE * SIZE)
    # ArgMax reads every channel of every pixel, and stores its int64 indices
    assert (layers["argmax"].bpu_type, layers["argmax"].ops) == ("HzArgMax", 8 * SIZE * SIZE)
    assert layers["argmax"].stored_bytes > 0


def test_checker_names_no_custom_op_registration_for_a_foreign_operator(tmp_path):
    from bpuemu.common.errors import BpuEmuError

    m = pow_argmax_model()
    m.graph.node[1].domain = "vendor.ops"
    m.opset_import.append(helper.make_opsetid("vendor.ops", 1))
    onnx.save(m, str(tmp_path / "m.onnx"))
    with pytest.raises(BpuEmuError) as exc:
        check(str(tmp_path / "m.onnx"), {})
    text = f"{exc.value} {exc.value.hint}"
    assert "Not support layer name=pow type=Pow" in text
    assert "standard ONNX operators only" in text and "register" not in text


def test_argmax_over_65_channels_is_a_cpu_op_in_the_bin(tmp_path):
    art = _convert(tmp_path, pow_argmax_model(channels=65))
    plan = read_bin(art.bin).model().plan
    cpu = [s for s in plan if s.kind == Kind.CPU_OP]
    assert [s.source_nodes[-1] for s in cpu] == ["argmax"]
    assert any("pow" in s.source_nodes for s in plan if s.kind == Kind.BPU_SUBGRAPH)


# --- --fast-perf ---------------------------------------------------------------------------------

def boundary_model() -> onnx.ModelProto:
    """NHWC input -> Transpose -> Conv -> Relu -> Conv -> Reshape -> output: CPU nodes at both ends."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.3).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([1, 4 * SIZE * SIZE], np.int64), "flat")]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], name="Transpose_in", perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["xt", "w1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", kernel_shape=[1, 1]),
             helper.make_node("Reshape", ["c2", "flat"], ["y"], name="Reshape_out")]
    graph = helper.make_graph(nodes, "boundary", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SIZE, SIZE, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4 * SIZE * SIZE])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_fast_perf_removes_the_boundary_nodes(tmp_path):
    onnx.save(boundary_model(), str(tmp_path / "m.onnx"))
    run = subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_mapper", "makertbin", "--fast-perf", "--model", "m.onnx",
                          "--model-type", "onnx", "--march", "bayes-e"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    path = tmp_path / "model_output" / "m.bin"
    model = read_bin(str(path)).model()
    kinds = [model_pb2.PlanStep.Kind.Name(s.kind) for s in model.plan]
    # what is left: the featuremap input straight into the BPU subgraph, its raw output straight out
    assert "QUANTIZE" not in kinds and "DEQUANTIZE" not in kinds and "CPU_OP" not in kinds, kinds
    assert kinds.count("BPU_SUBGRAPH") == 1
    deleted = list(model.build_info.deleted_nodes)
    assert "Transpose_in" in deleted and "Reshape_out" in deleted
    assert any(d.endswith("_HzQuantize") for d in deleted) and any(d.endswith("_HzDequantize") for d in deleted)
    # the model's interface is now the BPU's: int8 in, int8/int32 out, with their scales
    assert model.inputs[0].tensor_type == model_pb2.HB_DNN_TENSOR_TYPE_S8
    assert model.outputs[0].quanti_type == model_pb2.SCALE
    info = subprocess.run([sys.executable, "-c", "import sys; from bpuemu.host.cli.hb_model_info import main; "
                           "main(sys.argv[1:])", str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    text = info.stdout + info.stderr
    assert "deleted nodes: Transpose_in" in text and "deleted nodes: Reshape_out" in text
    # the runtime runs the result
    rt = Runtime()
    rt.load(str(path))
    m = rt.model()
    x = random_rt_input(m.model.input_specs[0], np.random.default_rng(0))
    assert m.run([x])[0].size == 4 * SIZE * SIZE


def test_fast_perf_types_are_the_seeds():
    assert set(FAST_PERF_REMOVED_TYPES) == {"Quantize", "Dequantize", "Transpose", "Cast", "Reshape"}
