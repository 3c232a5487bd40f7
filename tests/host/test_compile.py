"""The compile stage: input_batch, layer_out_dump, the O3 cache; and HB_ONNXRuntime's input conversions."""
import os

import numpy as np
import onnx
import pytest

from bpuemu.board.runtime import Runtime
from bpuemu.common.container import write_bin
from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import random_rt_input, to_model_input
from bpuemu.host import HB_ONNXRuntime
from bpuemu.host.compiler.compile import CACHE_DIR, compile_for_board
from bpuemu.host.mapper.makertbin import makertbin_from_config

from makertbin_helpers import sample_project


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compile_stage")
    cfg, _ = sample_project(tmp, "rgb", "NHWC", samples=4)
    art = makertbin_from_config(cfg)
    model = Runtime()
    model.load(art.bin)
    return art, model.model().model


def _run_bin(tmp_path, model, blobs, inputs):
    path = str(tmp_path / "m.bin")
    write_bin(path, [model], blobs)
    rt = Runtime()
    rt.load(path)
    return rt.model().run(inputs)


def test_input_batch_makes_the_bin_take_n_frames(tmp_path, converted):
    art, model = converted
    q = onnx.load(art.quantized)
    specs = list(model.input_specs)
    m, blobs, hit = compile_for_board(q, "b4", specs, working_dir=str(tmp_path), input_batch=4)
    assert not hit
    assert list(m.inputs[0].valid_shape) == [4, 32, 32, 3]
    assert list(m.outputs[0].valid_shape)[0] == 4
    frames = [random_rt_input(model.input_specs[0], np.random.default_rng(i)) for i in range(4)]
    out = _run_bin(tmp_path, m, blobs, [np.concatenate(frames)])[0]
    sess = HB_ONNXRuntime(art.quantized)
    for i, f in enumerate(frames):  # each frame of the batch equals the batch-1 quantized model's answer
        ref = sess.run(None, {"data": to_model_input(f, model.input_specs[0])})[0]
        assert np.array_equal(out[i : i + 1], ref)
    # the ONNX artifacts keep batch 1
    assert [d.dim_value for d in q.graph.input[0].type.tensor_type.shape.dim][0] == 1


def test_input_batch_is_refused_for_a_batch_one_only_model(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([1, 48], np.int64), "shape")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Reshape", ["d", "shape"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z"), shape]
    g = helper.make_graph(nodes, "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 48])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    from bpuemu.host.compiler.partition import featuremap_specs

    with pytest.raises(InvalidInput, match="does not support configuring input_batch 2"):
        compile_for_board(m, "r", featuremap_specs(m), working_dir=str(tmp_path), input_batch=2)


def test_layer_out_dump_adds_dequantized_conv_outputs(tmp_path, converted):
    art, model = converted
    q = onnx.load(art.quantized)
    m, blobs, _ = compile_for_board(q, "dump", list(model.input_specs), working_dir=str(tmp_path), layer_out_dump=True)
    names = [o.name for o in m.outputs]
    assert names[0] == "prob" and len(names) > 3
    assert all(n.endswith("_layer_out") for n in names[1:])
    x = random_rt_input(model.input_specs[0], np.random.default_rng(0))
    outs = _run_bin(tmp_path, m, blobs, [x])
    ref = HB_ONNXRuntime(art.quantized).run(None, {"data": to_model_input(x, model.input_specs[0])})[0]
    assert np.array_equal(outs[0], ref)  # the real output is unchanged
    assert all(o.dtype == np.float32 and o.ndim == 4 for o in outs[1:])


def test_o3_cache_hits_on_an_unchanged_rerun_and_misses_on_a_change(tmp_path, converted):
    art, model = converted
    q = onnx.load(art.quantized)
    specs = list(model.input_specs)
    m1, b1, hit1 = compile_for_board(q, "c", specs, working_dir=str(tmp_path))
    m2, b2, hit2 = compile_for_board(q, "c", specs, working_dir=str(tmp_path))
    assert (hit1, hit2) == (False, True) and b1 == b2 and list(m1.plan) == list(m2.plan)
    assert len(os.listdir(tmp_path / CACHE_DIR)) == 1
    _, _, hit3 = compile_for_board(q, "c", specs, working_dir=str(tmp_path), optimize_level="O3", force_cpu=["Conv_0"])
    assert hit3 is False
    _, _, hit4 = compile_for_board(q, "c", specs, working_dir=str(tmp_path / "other"), optimize_level="O2")
    assert hit4 is False and not (tmp_path / "other" / CACHE_DIR).exists()
    # a damaged cache entry is a miss, not an error
    for entry in (tmp_path / CACHE_DIR).iterdir():
        entry.write_bytes(b"garbage")
    _, _, hit5 = compile_for_board(q, "c", specs, working_dir=str(tmp_path))
    assert hit5 is False


def test_hb_onnxruntime_converts_uint8_int8_float_without_loss(converted):
    art, model = converted
    sess = HB_ONNXRuntime(art.quantized)
    assert sess.input_names == ["data"] and sess.output_names == ["prob"]
    u8 = np.random.default_rng(3).integers(0, 256, (1, 3, 32, 32), dtype=np.uint8)
    i8 = (u8.astype(np.int16) - 128).astype(np.int8)
    a = sess.run(None, {"data": u8})[0]
    b = sess.run(None, {"data": i8})[0]
    c = sess.run(None, {"data": i8.astype(np.float32)})[0]
    assert np.array_equal(a, b) and np.array_equal(b, c)
    with pytest.raises(InvalidInput, match="without loss"):
        sess.run(None, {"data": i8.astype(np.float32) + 0.5})
    with pytest.raises(InvalidInput, match="missing input"):
        sess.run(None, {})
    # the float and calibrated models take X_128 floats; uint8 is shifted the same way
    for path in (art.original, art.optimized, art.calibrated):
        fs = HB_ONNXRuntime(path)
        assert np.allclose(fs.run(None, {"data": u8})[0], fs.run(None, {"data": i8.astype(np.float32)})[0])
