"""The Preprocess of an image input compiled into the BPU subgraph that reads it (host/compiler/fuse_preprocess).

The fused plan must compute exactly what the plan with a converting Preprocess
step computes (which the runtime tests hold bit-exact to quanti.onnx), and say
in its plan which inputs it fused.
"""
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from bpuemu.board.runtime.model import LoadedModel
from bpuemu.common.input_types import rt_shape, to_model_input
from bpuemu.common.proto import model_pb2
from bpuemu.host import samples
from bpuemu.host.compiler.partition import compile_model
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
    assert piece.graph.node[0].op_type == "Transpose"
    inits = {t.name: numpy_helper.to_array(t) for t in piece.graph.initializer}
    old = {t.name: numpy_helper.to_array(t) for t in before.graph.initializer}
    dq = next(n for n in piece.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == piece.graph.node[0].output[0])
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
