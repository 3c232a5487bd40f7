"""The Preprocess of an image input compiled into the BPU subgraph that reads it (host/compiler/fuse_preprocess).

The fused plan must compute exactly what the plan with a converting Preprocess
step computes (which the runtime tests hold bit-exact to quanti.onnx), and say
in its plan which inputs it fused.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bpuemu.board.runtime.model import LoadedModel
from bpuemu.common.input_types import rt_shape, to_model_input
from bpuemu.common.proto import model_pb2
from bpuemu.host import samples
from bpuemu.host.compiler import fuse_preprocess
from bpuemu.host.compiler.fuse_preprocess import LAYOUT_SUFFIX, layout_nodes
from bpuemu.host.compiler.partition import compile_model
from bpuemu.host.compiler.timing.estimate import annotate
from bpuemu.host.onnxgraph import open_session
from helpers import models as M

Kind = model_pb2.PlanStep
SIZE = 16


@pytest.fixture(scope="module", params=[True, False], ids=["per_channel", "per_tensor"])
def qmodel(request):
    return M.quantized_sample(request.param, SIZE, image_input=True)


def _both(qmodel, spec, **kw):
    fused = compile_model(qmodel, "m", [spec], **kw)
    plain = compile_model(qmodel, "m", [spec], fuse_preprocess_steps=False, **kw)
    return fused, plain


@pytest.mark.parametrize("rt,layout", [("rgb", "NHWC"), ("bgr", "NCHW"), ("yuv444", "NHWC")])
def test_fused_plan_equals_the_converting_plan_bit_for_bit(qmodel, rt, layout, rng):
    spec = samples.image_input_spec(qmodel, rt, layout)
    fused, plain = _both(qmodel, spec)
    pre = fused.model.plan[0]
    assert pre.kind == Kind.PREPROCESS and pre.name == "Preprocess" and pre.fused_into_subgraph
    assert list(pre.outputs) == ["rt:data"] and "rt:data" in fused.model.plan[1].inputs
    assert not plain.model.plan[0].fused_into_subgraph
    a, b = LoadedModel(fused.model, fused.blobs), LoadedModel(plain.model, plain.blobs)
    for _ in range(3):
        x = rng.integers(0, 256, rt_shape(spec), dtype=np.uint8)
        out_a, inter_a = a.run([x], keep_intermediate=True)
        out_b, inter_b = b.run([x], keep_intermediate=True)
        assert all(np.array_equal(p, q) and p.dtype == q.dtype for p, q in zip(out_a, out_b))
        assert inter_a.keys() == inter_b.keys() and "data" in inter_a  # dumps still show the model input
        for k in inter_b:
            assert inter_a[k].dtype == inter_b[k].dtype and np.array_equal(inter_a[k], inter_b[k]), k
        assert np.array_equal(inter_a["data"], to_model_input(x, spec))


def test_the_subgraph_takes_uint8_rt_data_with_the_zero_point_shifted(qmodel):
    spec = samples.image_input_spec(qmodel, "rgb", "NHWC")
    fused, plain = _both(qmodel, spec)
    piece = onnx.load_from_string(fused.blobs[fused.model.plan[1].blob])
    before = onnx.load_from_string(plain.blobs[plain.model.plan[1].blob])
    assert piece.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert [d.dim_value for d in piece.graph.input[0].type.tensor_type.shape.dim] == [1, SIZE, SIZE, 3]
    layout = next(n for n in piece.graph.node if n.name == f"data{LAYOUT_SUFFIX}")
    assert [n.op_type for n in piece.graph.node][:5] == ["Reshape", "Transpose", "Reshape", "Transpose", "Reshape"]
    inits = {t.name: numpy_helper.to_array(t) for t in piece.graph.initializer}
    old = {t.name: numpy_helper.to_array(t) for t in before.graph.initializer}
    dq = next(n for n in piece.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == layout.output[0])
    dq_before = next(n for n in before.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "data")
    assert inits[dq.input[2]].dtype == np.uint8
    assert np.array_equal(inits[dq.input[2]].astype(np.int16), old[dq_before.input[2]].astype(np.int16) + 128)


def test_inputs_that_cannot_be_fused_keep_the_converting_step(qmodel):
    for rt in ("nv12",):
        fused, _ = _both(qmodel, samples.image_input_spec(qmodel, rt, "NHWC"))
        assert not fused.model.plan[0].fused_into_subgraph
    # The input's first reader on the CPU: nothing to fuse into.
    first_conv = next(n.name for n in qmodel.graph.node if n.op_type == "Conv")
    fused, _ = _both(qmodel, samples.image_input_spec(qmodel, "rgb", "NHWC"), force_cpu=[first_conv])
    assert not fused.model.plan[0].fused_into_subgraph
    featuremap = M.quantized_sample(True, SIZE, image_input=False)
    from bpuemu.host.compiler.partition import featuremap_specs

    fm = compile_model(featuremap, "fm", featuremap_specs(featuremap))
    assert not any(s.fused_into_subgraph for s in fm.model.plan)


@pytest.mark.parametrize("shape,perm,transposes", [
    ((1, 16, 16, 3), [0, 3, 1, 2], 2),     # rows of 16 pixels
    ((2, 6, 4, 3), [0, 3, 1, 2], 2),       # a batch of 2, 24 pixels: rows of 8
    ((1, 48, 192, 3), [0, 3, 1, 2], 2),    # PP-OCR cls
    ((1, 5, 3, 3), [0, 3, 1, 2], 1),       # 15 pixels: no whole rows, one Transpose
    ((1, 8, 8, 1), [0, 3, 1, 2], 1),       # one channel
    ((1, 3, 8, 8), [0, 2, 3, 1], 1),       # NCHW -> NHWC
])
def test_the_layout_change_is_numpys_transpose_byte_for_byte(shape, perm, transposes, rng):
    """The two-pass NHWC -> NCHW (what onnxruntime runs with vector instructions) moves every byte
    where one Transpose would, on every shape; where it cannot, one Transpose."""
    nodes, inits = layout_nodes("x", "y", shape, perm, "data" + LAYOUT_SUFFIX)
    assert sum(n.op_type == "Transpose" for n in nodes) == transposes and nodes[-1].output[0] == "y"
    out = [shape[i] for i in perm]
    graph = helper.make_graph(nodes, "layout", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, out)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = rng.integers(0, 256, shape, dtype=np.uint8)
    y = open_session(model).run(None, {"x": x})[0]
    assert y.shape == tuple(out) and np.array_equal(y, x.transpose(perm))


def test_the_x5_estimate_costs_the_two_passes_as_one_transpose(qmodel, monkeypatch):
    """The X5 moves the input's layout once: the timing the .bin stores is the one-Transpose piece's."""
    spec = samples.image_input_spec(qmodel, "rgb", "NHWC")
    two = compile_model(qmodel, "m", [spec])
    monkeypatch.setattr(fuse_preprocess, "_ROW_PIXELS", ())
    one = compile_model(qmodel, "m", [spec])
    assert [n.op_type for n in onnx.load_from_string(one.blobs[one.model.plan[1].blob]).graph.node][0] == "Transpose"
    a, b = annotate(two.model, two.blobs), annotate(one.model, one.blobs)
    assert [s.x5_us for s in two.model.plan] == [s.x5_us for s in one.model.plan]
    assert a.plan == b.plan and a.ddr_bytes == b.ddr_bytes
