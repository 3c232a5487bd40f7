"""compile_model (QDQ ONNX -> execution plan + blobs) and the sample models of host/samples.py."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bpuemu.common.container import file_sha256, read_bin
from bpuemu.common.errors import InvalidInput
from bpuemu.common.proto import model_pb2
from bpuemu.host import samples
from bpuemu.host.compiler.partition import compile_model, featuremap_specs
from bpuemu.host.compiler.optable import BPU_OPS
from helpers import models as M

Kind = model_pb2.PlanStep
LAYOUT = model_pb2.TensorLayout


def kinds(model):
    return [(Kind.Kind.Name(s.kind), s.name) for s in model.plan]


def blob_graph(compiled, step) -> onnx.GraphProto:
    m = onnx.load_from_string(compiled.blobs[step.blob])
    onnx.checker.check_model(m)
    return m.graph


def elem_types(values):
    return {v.name: v.type.tensor_type.elem_type for v in values}


# --- plan of a model with a CPU op between two BPU subgraphs ------------------------------

def test_cpu_middle_plan(cpu_middle):
    assert kinds(cpu_middle.model) == [
        ("PREPROCESS", "Preprocess"),
        ("QUANTIZE", "x_QuantizeLinear_HzQuantize"),
        ("LAYOUT_CONVERT", "cpu_middle_subgraph_0_input_layout_convert"),
        ("BPU_SUBGRAPH", "BPU_cpu_middle_subgraph_0"),
        ("LAYOUT_CONVERT", "cpu_middle_subgraph_0_output_layout_convert"),
        ("CPU_OP", "Softmax_mid"),
        ("LAYOUT_CONVERT", "cpu_middle_subgraph_1_input_layout_convert"),
        ("BPU_SUBGRAPH", "BPU_cpu_middle_subgraph_1"),
        ("LAYOUT_CONVERT", "cpu_middle_subgraph_1_output_layout_convert"),
        ("DEQUANTIZE", "y_DequantizeLinear_HzDequantize"),
    ]
    assert cpu_middle.compiled.device_of() == {
        "x_QuantizeLinear": "CPU",
        "Conv_a": "BPU", "Conv_a_relu_QuantizeLinear": "BPU",
        "Softmax_mid": "CPU", "Softmax_mid_out_QuantizeLinear": "CPU",
        "Conv_b": "BPU", "y_QuantizeLinear": "BPU",
        "y_DequantizeLinear": "CPU",
    }


def test_plan_tensors_flow_in_order(cpu_middle):
    """Every step reads only tensors an earlier step produced (or the rt: inputs)."""
    available = {f"rt:{s.name}" for s in cpu_middle.model.input_specs}
    for step in cpu_middle.model.plan:
        missing = [i for i in step.inputs if i not in available]
        assert not missing, f"{step.name} reads {missing} before they exist"
        available.update(step.outputs)
    assert set(cpu_middle.model.output_tensors) <= available


def test_bpu_subgraphs_exchange_only_int8(cpu_middle):
    for step in cpu_middle.model.plan:
        if step.kind != Kind.BPU_SUBGRAPH:
            continue
        g = blob_graph(cpu_middle.compiled, step)
        assert [i.name for i in g.input] == list(step.inputs)
        assert [o.name for o in g.output] == list(step.outputs)
        assert set(elem_types(g.input).values()) == {TensorProto.INT8}, step.name
        assert set(elem_types(g.output).values()) == {TensorProto.INT8}, step.name
        compute = [n.op_type for n in g.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
        assert compute and all(op in BPU_OPS for op in compute)
        assert list(step.op_types) == [n.op_type for n in g.node if n.name in set(step.source_nodes)]


def test_cpu_op_piece_is_dq_op_q(cpu_middle):
    step = next(s for s in cpu_middle.model.plan if s.name == "Softmax_mid")
    g = blob_graph(cpu_middle.compiled, step)
    assert [n.op_type for n in g.node] == ["DequantizeLinear", "Softmax", "QuantizeLinear"]
    assert set(elem_types(g.input).values()) == {TensorProto.INT8}
    assert set(elem_types(g.output).values()) == {TensorProto.INT8}
    assert list(step.op_types) == ["Softmax", "QuantizeLinear"]


def test_quantize_step_takes_the_float_input(cpu_middle):
    step = next(s for s in cpu_middle.model.plan if s.kind == Kind.QUANTIZE)
    g = blob_graph(cpu_middle.compiled, step)
    assert elem_types(g.input) == {"x": TensorProto.FLOAT}
    assert set(elem_types(g.output).values()) == {TensorProto.INT8}


def test_dequantize_step_parameters(cpu_middle):
    step = next(s for s in cpu_middle.model.plan if s.kind == Kind.DEQUANTIZE)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in cpu_middle.qmodel.graph.initializer}
    dq = next(n for n in cpu_middle.qmodel.graph.node if n.name == "y_DequantizeLinear")
    assert list(step.inputs) == [dq.input[0]] and list(step.outputs) == ["y"]
    assert np.array_equal(np.asarray(step.scale, np.float32), inits[dq.input[1]].reshape(-1))
    assert list(step.zero_point) == inits[dq.input[2]].reshape(-1).tolist()
    assert not step.blob
    assert list(step.source_nodes) == ["y_DequantizeLinear"]


def test_per_channel_output_dequantize_parameters(tmp_path):
    q = M.per_channel_output_dequantize(M.quantize_qdq(M.residual_model(c=6), per_channel=True), "y")
    compiled = compile_model(q, "pc")
    step = next(s for s in compiled.model.plan if s.kind == Kind.DEQUANTIZE)
    assert len(step.scale) == len(step.zero_point) == 6
    assert step.axis == 1
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in q.graph.initializer}
    assert np.array_equal(np.asarray(step.scale, np.float32), inits["out_pc_scale"])
    assert list(step.zero_point) == inits["out_pc_zp"].tolist()


def test_io_properties_of_a_featuremap_model(cpu_middle):
    m = cpu_middle.model
    (inp,) = m.inputs
    assert inp.name == "x" and list(inp.valid_shape) == [1, 3, 16, 16]
    assert inp.tensor_type == model_pb2.HB_DNN_TENSOR_TYPE_F32
    assert inp.tensor_layout == LAYOUT.HB_DNN_LAYOUT_NCHW
    assert inp.aligned_byte_size == 3 * 16 * 16 * 4
    (out,) = m.outputs
    assert out.name == "y" and list(out.valid_shape) == [1, 8, 16, 16]
    assert out.tensor_type == model_pb2.HB_DNN_TENSOR_TYPE_F32
    assert out.tensor_layout == LAYOUT.HB_DNN_LAYOUT_NCHW
    assert list(m.output_tensors) == ["y"]
    assert m.march == "bayes-e"


def test_every_blob_is_used_once_and_loads(cpu_middle):
    named = [s.blob for s in cpu_middle.model.plan if s.blob]
    assert sorted(named) == sorted(cpu_middle.compiled.blobs)
    assert len(set(named)) == len(named)
    for step in cpu_middle.model.plan:
        if step.blob:
            blob_graph(cpu_middle.compiled, step)


def test_written_file_holds_the_compiled_model(cpu_middle):
    b = read_bin(cpu_middle.path)
    assert b.model() == cpu_middle.model
    assert b.blobs == cpu_middle.compiled.blobs


# --- options and refusals ---------------------------------------------------------------------

def test_force_cpu_moves_a_node_off_the_bpu(cpu_middle, tmp_path, rng):
    compiled = compile_model(cpu_middle.qmodel, "forced", force_cpu=["Conv_b"])
    device = compiled.device_of()
    assert device["Conv_b"] == "CPU" and device["Conv_a"] == "BPU"
    names = [s.name for s in compiled.model.plan]
    assert "BPU_forced_subgraph_1" not in names and "Conv_b" in names
    # Still bit-exact with the whole quantized model.
    from bpuemu.board.runtime import Runtime
    from bpuemu.common.container import write_bin

    write_bin(tmp_path / "f.bin", [compiled.model], compiled.blobs)
    rt = Runtime()
    rt.load(tmp_path / "f.bin")
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    assert np.array_equal(rt.model().run([x])[0], M.run_reference(cpu_middle.qmodel, {"x": x})[0])


def test_build_info_is_carried(cpu_middle):
    info = samples.sample_build_info("m", "rgb")
    compiled = compile_model(cpu_middle.qmodel, "m", build_info=info, march="bayes-e")
    assert compiled.model.build_info == info
    assert compiled.model.build_info.input_parameters[0].params[0].value == "rgb"


def test_input_specs_must_match_the_model(cpu_middle):
    spec = model_pb2.InputSpec(name="z", input_type_rt="featuremap", model_dtype="float32",
                               model_shape=[1, 3, 16, 16], plan_tensor="z")
    with pytest.raises(InvalidInput, match=r"input specs \['z'\] do not match the model inputs \['x'\]"):
        compile_model(cpu_middle.qmodel, "m", [spec])


def test_dynamic_shape_is_refused():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 4, 4])],
    )
    with pytest.raises(InvalidInput, match="dynamic shape"):
        featuremap_specs(helper.make_model(graph))


def test_featuremap_specs():
    (spec,) = featuremap_specs(M.two_input_model())[:1]
    assert spec.name == "a" and spec.input_type_rt == "featuremap"
    assert spec.model_layout == "NCHW" and spec.model_dtype == "float32"
    assert list(spec.model_shape) == [1, 3, 16, 16] and spec.plan_tensor == "a"
    assert [s.name for s in featuremap_specs(M.two_input_model())] == ["a", "b"]


# --- host/samples.py -----------------------------------------------------------------------------

def test_sample_float_model_shapes():
    m = samples.sample_float_model(32, 48, channels=(8, 16), classes=5)
    dims = lambda vi: [d.dim_value for d in vi.type.tensor_type.shape.dim]  # noqa: E731
    assert dims(m.graph.input[0]) == [1, 3, 32, 48]
    assert dims(m.graph.output[0]) == [1, 5]
    assert m.graph.node[0].name == "HzPreprocess"
    assert "HzPreprocess" not in [n.name for n in samples.sample_float_model(16, 16, image_input=False).graph.node]


def test_quantized_sample_takes_int8_input():
    fm = samples.sample_float_model(16, 16)
    q = samples.quantize_sample(fm, samples.calibration_samples(fm, count=2))
    assert q.graph.input[0].type.tensor_type.elem_type == TensorProto.INT8
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "data" for n in q.graph.node)
    spec = samples.image_input_spec(q, "nv12")
    assert spec.input_layout_rt == "" and spec.model_dtype == "int8" and list(spec.model_shape) == [1, 3, 16, 16]


@pytest.mark.parametrize(
    "input_type_rt, layout, shape, tensor_type, tensor_layout, nbytes, source",
    [
        ("rgb", "NHWC", [1, 16, 16, 3], "HB_DNN_IMG_TYPE_RGB", LAYOUT.HB_DNN_LAYOUT_NHWC, 768, "HB_DNN_INPUT_FROM_DDR"),
        ("bgr", "NCHW", [1, 3, 16, 16], "HB_DNN_IMG_TYPE_BGR", LAYOUT.HB_DNN_LAYOUT_NCHW, 768, "HB_DNN_INPUT_FROM_DDR"),
        ("yuv444", "NHWC", [1, 16, 16, 3], "HB_DNN_IMG_TYPE_YUV444", LAYOUT.HB_DNN_LAYOUT_NHWC, 768, "HB_DNN_INPUT_FROM_DDR"),
        ("nv12", "NHWC", [1, 3, 16, 16], "HB_DNN_IMG_TYPE_NV12", LAYOUT.HB_DNN_LAYOUT_NCHW, 384, "HB_DNN_INPUT_FROM_PYRAMID"),
        ("featuremap", "NHWC", [1, 3, 16, 16], "HB_DNN_TENSOR_TYPE_F32", LAYOUT.HB_DNN_LAYOUT_NCHW, 3072, "HB_DNN_INPUT_FROM_DDR"),
    ],
)
def test_sample_bin(tmp_path, input_type_rt, layout, shape, tensor_type, tensor_layout, nbytes, source):
    path = tmp_path / "s.bin"
    sha = samples.sample_bin(str(path), input_type_rt, layout, 16, 16)
    assert sha == file_sha256(path)
    m = read_bin(path).model()
    assert m.name == f"sample_16x16_{input_type_rt}"
    (inp,) = m.inputs
    assert list(inp.valid_shape) == shape
    assert model_pb2.TensorType.Name(inp.tensor_type) == tensor_type
    assert inp.tensor_layout == tensor_layout
    assert inp.aligned_byte_size == nbytes
    assert model_pb2.InputSource.Name(inp.input_source) == source
    assert list(m.outputs[0].valid_shape) == [1, 10]
    names = [s.name for s in m.plan]
    assert names[0] == "Preprocess"
    assert f"BPU_{m.name}_subgraph_0" in names and "Softmax_prob" in names
    assert names.index(f"{m.name}_subgraph_0_output_layout_convert") < names.index("Softmax_prob")
    assert ("data_QuantizeLinear_HzQuantize" in names) == (input_type_rt == "featuremap")
    deps = {kv.key: kv.value for kv in m.build_info.deps}
    assert "hb_mapper version" in deps
    params = {kv.key: kv.value for kv in m.build_info.input_parameters[0].params}
    assert params["input_type_rt"] == input_type_rt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.bin"]


def test_sample_bin_name_and_quantized_model(tmp_path):
    q = tmp_path / "q.onnx"
    samples.sample_bin(str(tmp_path / "n.bin"), "rgb", height=16, width=16, name="mine", quantized_path=str(q))
    assert read_bin(tmp_path / "n.bin").model_names == ["mine"]
    onnx.checker.check_model(onnx.load(str(q)))
