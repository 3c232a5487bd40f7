"""The emulated BPU runtime against the whole quantized model run by onnxruntime.

The core contract (DESIGN.md, "Numerical contract"): a `.bin` compiled from a
QDQ model and run by the runtime gives, bit for bit, what the whole quantized
model gives in onnxruntime with the runtime's session options.
"""
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bpuemu.board.runtime import LoadedModel, Runtime, run_frames
from bpuemu.board.runtime.model import DequantizeStep
from bpuemu.board.runtime.sessions import SESSION_CONFIG, session_options
from bpuemu.common.container import read_bin
from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.common.input_types import rt_shape
from bpuemu.common.proto import model_pb2
from bpuemu.host import samples
from helpers import models as M

SIZE = 16
Kind = model_pb2.PlanStep


def load(path, **kw) -> LoadedModel:
    rt = Runtime(**kw)
    rt.load([path])
    return rt.model()


def assert_bit_exact(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.array_equal(g, w), f"max abs diff {np.max(np.abs(g.astype(np.float64) - w))}"


def check_frames(model: LoadedModel, qmodel: onnx.ModelProto, frames):
    """frames: (runtime input list, reference feed dict) pairs."""
    ref = M.reference_session(qmodel)
    for rt_inputs, feed in frames:
        out = model.run(rt_inputs)
        assert_bit_exact(out, ref.run(None, feed))


# --- the sample CNN of host/samples.py -----------------------------------------------

@pytest.fixture(scope="module", params=[True, False], ids=["per_channel", "per_tensor"])
def sample_image_q(request):
    return M.quantized_sample(request.param, SIZE, image_input=True)


@pytest.fixture(scope="module", params=[True, False], ids=["per_channel", "per_tensor"])
def sample_featuremap_q(request):
    return M.quantized_sample(request.param, SIZE, image_input=False)


@pytest.mark.parametrize(
    "input_type_rt, layout",
    [("rgb", "NHWC"), ("rgb", "NCHW"), ("bgr", "NHWC"), ("bgr", "NCHW"), ("yuv444", "NHWC"), ("yuv444", "NCHW")],
)
def test_sample_image_inputs_are_bit_exact(tmp_path, sample_image_q, input_type_rt, layout, rng):
    spec = samples.image_input_spec(sample_image_q, input_type_rt, layout)
    M.build_bin(tmp_path / "m.bin", sample_image_q, "sample", [spec])
    model = load(tmp_path / "m.bin")
    assert tuple(model.input_properties[0].valid_shape) == ((1, SIZE, SIZE, 3) if layout == "NHWC" else (1, 3, SIZE, SIZE))
    frames = []
    for _ in range(3):
        img = rng.integers(0, 256, rt_shape(spec), dtype=np.uint8)
        frames.append(([img], {"data": M.image_to_model_input(img, layout)}))
    check_frames(model, sample_image_q, frames)


def test_sample_nv12_is_bit_exact(tmp_path, sample_image_q, rng):
    spec = samples.image_input_spec(sample_image_q, "nv12")
    M.build_bin(tmp_path / "m.bin", sample_image_q, "sample", [spec])
    model = load(tmp_path / "m.bin")
    assert model.input_properties[0].aligned_byte_size == SIZE * SIZE * 3 // 2
    frames = []
    for _ in range(3):
        nv12 = rng.integers(0, 256, SIZE * SIZE * 3 // 2, dtype=np.uint8)
        frames.append(([nv12], {"data": M.nv12_to_model_input(nv12, 1, SIZE, SIZE)}))
    check_frames(model, sample_image_q, frames)


def test_sample_featuremap_is_bit_exact(tmp_path, sample_featuremap_q, rng):
    M.build_bin(tmp_path / "m.bin", sample_featuremap_q, "sample")
    model = load(tmp_path / "m.bin")
    names = [s.name for s in model.model.plan]
    assert "data_QuantizeLinear_HzQuantize" in names
    frames = []
    for _ in range(3):
        x = (rng.standard_normal((1, 3, SIZE, SIZE)) * 1.5).astype(np.float32)
        frames.append(([x], {"data": x}))
    check_frames(model, sample_featuremap_q, frames)


@pytest.mark.parametrize("input_type_rt", ["rgb", "nv12", "featuremap"])
def test_sample_bin_is_bit_exact_with_its_quantized_model(tmp_path, input_type_rt, rng):
    qpath = tmp_path / "quantized.onnx"
    samples.sample_bin(str(tmp_path / "s.bin"), input_type_rt, "NHWC", SIZE, SIZE, quantized_path=str(qpath))
    qmodel = onnx.load(str(qpath))
    model = load(tmp_path / "s.bin")
    assert model.name == f"sample_{SIZE}x{SIZE}_{input_type_rt}"
    if input_type_rt == "rgb":
        x = rng.integers(0, 256, (1, SIZE, SIZE, 3), dtype=np.uint8)
        feed = M.image_to_model_input(x, "NHWC")
    elif input_type_rt == "nv12":
        x = rng.integers(0, 256, SIZE * SIZE * 3 // 2, dtype=np.uint8)
        feed = M.nv12_to_model_input(x, 1, SIZE, SIZE)
    else:
        x = rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)
        feed = x
    check_frames(model, qmodel, [([x], {"data": feed})])


@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_gray_input_is_bit_exact(tmp_path, per_channel, layout, rng):
    q = M.quantize_image_input(M.gray_model(), per_channel=per_channel)
    spec = samples.image_input_spec(q, "gray", layout)
    M.build_bin(tmp_path / "g.bin", q, "gray", [spec])
    model = load(tmp_path / "g.bin")
    assert model.input_properties[0].tensor_type == model_pb2.HB_DNN_IMG_TYPE_Y
    frames = []
    for _ in range(2):
        img = rng.integers(0, 256, rt_shape(spec), dtype=np.uint8)
        assert img.shape == ((1, SIZE, SIZE, 1) if layout == "NHWC" else (1, 1, SIZE, SIZE))
        frames.append(([img], {"data": M.image_to_model_input(img, layout)}))
    check_frames(model, q, frames)


# --- a CPU op between two BPU subgraphs ----------------------------------------------

def test_cpu_op_between_two_bpu_subgraphs_is_bit_exact(cpu_middle, rng):
    names = cpu_middle.step_names()
    kinds = {s.name: s.kind for s in cpu_middle.model.plan}
    assert kinds["BPU_cpu_middle_subgraph_0"] == Kind.BPU_SUBGRAPH
    assert kinds["BPU_cpu_middle_subgraph_1"] == Kind.BPU_SUBGRAPH
    assert kinds["Softmax_mid"] == Kind.CPU_OP
    assert names.index("BPU_cpu_middle_subgraph_0") < names.index("Softmax_mid") < names.index("BPU_cpu_middle_subgraph_1")
    for conv in ("cpu_middle_subgraph_0_output_layout_convert", "cpu_middle_subgraph_1_input_layout_convert"):
        assert kinds[conv] == Kind.LAYOUT_CONVERT
    model = load(cpu_middle.path)
    frames = []
    for _ in range(3):
        x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
        frames.append(([x], {"x": x}))
    check_frames(model, cpu_middle.qmodel, frames)


def test_every_boundary_tensor_is_bit_exact(cpu_middle, rng):
    """The int8 tensors the pieces hand each other equal the whole model's."""
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    _, inter = load(cpu_middle.path).run([x], keep_intermediate=True)
    boundary = sorted(
        o for s in cpu_middle.model.plan if s.kind in (Kind.BPU_SUBGRAPH, Kind.CPU_OP, Kind.QUANTIZE) for o in s.outputs
    )
    assert len(boundary) >= 4
    q = onnx.ModelProto.FromString(cpu_middle.qmodel.SerializeToString())
    q.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in boundary)
    want = M.run_reference(q, {"x": x})[1:]
    for name, w in zip(boundary, want):
        assert inter[name].dtype == np.int8, name
        assert np.array_equal(inter[name], w), name


def test_more_intra_op_threads_are_still_bit_exact(cpu_middle, rng):
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    check_frames(load(cpu_middle.path, intra_op_threads=2), cpu_middle.qmodel, [([x], {"x": x})])


# --- output DequantizeLinear, residual Add, two inputs, rank-2 featuremap ------------------

@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
@pytest.mark.parametrize("dequantize", ["per_tensor_dq", "per_channel_dq"])
def test_output_dequantize_step_is_bit_exact(tmp_path, per_channel, dequantize, rng):
    fmodel = M.residual_model()
    q = M.quantize_qdq(fmodel, per_channel=per_channel)
    if dequantize == "per_channel_dq":
        q = M.per_channel_output_dequantize(q, "y")
    case = M.build_case(tmp_path, fmodel, "residual", per_channel=per_channel, qmodel=q)
    steps = [s for s in case.model.plan if s.kind == Kind.DEQUANTIZE]
    assert [s.name for s in steps] == ["y_DequantizeLinear_HzDequantize"]
    assert len(steps[0].scale) == (8 if dequantize == "per_channel_dq" else 1)
    assert any(s.kind == Kind.BPU_SUBGRAPH and "Add" in s.op_types for s in case.model.plan)
    model = load(case.path)
    frames = []
    for _ in range(3):
        x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
        frames.append(([x], {"x": x}))
    check_frames(model, q, frames)


@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
def test_two_featuremap_inputs_are_bit_exact(tmp_path, per_channel, rng):
    case = M.build_case(tmp_path, M.two_input_model(), "two_in", per_channel=per_channel)
    model = load(case.path)
    assert model.input_names == ["a", "b"]
    ref = M.reference_session(case.qmodel)
    for _ in range(2):
        a = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
        b = rng.standard_normal((1, 2, 16, 16)).astype(np.float32)
        want = ref.run(None, {"a": a, "b": b})
        assert_bit_exact(model.run([a, b]), want)
        assert_bit_exact(model.run({"b": b, "a": a}), want)


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32) * np.float32(0.3), "w1"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32) * np.float32(0.1), "b1"),
        numpy_helper.from_array(rng.standard_normal((4, 32)).astype(np.float32) * np.float32(0.3), "w2"),
        numpy_helper.from_array(np.zeros(4, np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["v", "w1", "b1"], ["h"], name="Gemm_1", transB=1),
        helper.make_node("Relu", ["h"], ["hr"], name="Relu_1"),
        helper.make_node("Gemm", ["hr", "w2", "b2"], ["y"], name="Gemm_2", transB=1),
    ]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_rank_2_featuremap_model_is_bit_exact(tmp_path, rng):
    case = M.build_case(tmp_path, _mlp(), "mlp", per_channel=False)
    model = load(case.path)
    assert list(model.input_properties[0].valid_shape) == [2, 16]
    assert model.input_properties[0].aligned_byte_size == 2 * 16 * 4
    v = rng.standard_normal((2, 16)).astype(np.float32)
    check_frames(model, case.qmodel, [([v], {"v": v})])


# --- threads -----------------------------------------------------------------------

def test_two_threads_on_one_loaded_model_agree(cpu_middle, rng):
    model = load(cpu_middle.path)
    inputs = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(8)]
    expected = [model.run([x])[0] for x in inputs]
    barrier = threading.Barrier(2)
    results = {}
    errors = []

    def work(tid):
        try:
            barrier.wait()
            out = []
            for _ in range(5):
                order = range(len(inputs)) if tid == 0 else reversed(range(len(inputs)))
                out.extend((i, model.run([inputs[i]])[0]) for i in order)
            results[tid] = out
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(results) == 2
    for out in results.values():
        assert len(out) == 5 * len(inputs)
        for i, y in out:
            assert np.array_equal(y, expected[i])


# --- wrong input ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def rgb_model(tmp_path_factory, sample_image_q):
    path = tmp_path_factory.mktemp("rgb") / "rgb.bin"
    M.build_bin(path, sample_image_q, "rgb_model", [samples.image_input_spec(sample_image_q, "rgb", "NHWC")])
    return load(path)


def test_wrong_dtype_is_refused(rgb_model):
    with pytest.raises(InvalidInput) as exc:
        rgb_model.run([np.zeros((1, SIZE, SIZE, 3), np.float32)])
    text = str(exc.value)
    assert "'data'" in text and "must be uint8, got float32" in text
    assert f"validShape [1, {SIZE}, {SIZE}, 3]" in text and f"{SIZE * SIZE * 3} bytes" in text


def test_wrong_byte_size_is_refused(rgb_model):
    with pytest.raises(InvalidInput) as exc:
        rgb_model.run([np.zeros((1, SIZE, SIZE, 4), np.uint8)])
    msg = exc.value.message
    assert f"needs {SIZE * SIZE * 3} bytes" in msg and f"validShape [1, {SIZE}, {SIZE}, 3]" in msg
    assert f"got {SIZE * SIZE * 4}" in msg


def test_wrong_shape_is_refused(rgb_model):
    with pytest.raises(InvalidInput) as exc:
        rgb_model.run([np.zeros((1, 3, SIZE, SIZE), np.uint8)])
    assert f"expected validShape [1, {SIZE}, {SIZE}, 3]" in exc.value.message


def test_wrong_number_of_inputs_is_refused(rgb_model):
    x = np.zeros((1, SIZE, SIZE, 3), np.uint8)
    for given in ([], [x, x]):
        with pytest.raises(InvalidInput) as exc:
            rgb_model.run(given)
        assert "takes 1 input(s) ['data']" in exc.value.message and f"got {len(given)}" in exc.value.message


def test_dict_missing_an_input_is_refused(rgb_model):
    with pytest.raises(InvalidInput) as exc:
        rgb_model.run({"image": np.zeros((1, SIZE, SIZE, 3), np.uint8)})
    assert "missing ['data']" in exc.value.message


def test_featuremap_wrong_dtype_is_refused(cpu_middle):
    with pytest.raises(InvalidInput, match="'x' \\(featuremap\\) must be float32, got float64"):
        load(cpu_middle.path).run([np.zeros((1, 3, 16, 16))])


# --- loading ---------------------------------------------------------------------------

def test_runtime_loads_several_files_and_binfiles(cpu_middle, tmp_path, sample_image_q):
    M.build_bin(tmp_path / "other.bin", sample_image_q, "other", [samples.image_input_spec(sample_image_q)])
    rt = Runtime()
    assert rt.load(cpu_middle.path) == ["cpu_middle"]
    assert rt.load([read_bin(tmp_path / "other.bin")]) == ["other"]
    assert rt.model_names == ["cpu_middle", "other"]
    assert rt.model("other").name == "other"
    assert len(rt.files) == 2
    with pytest.raises(NotFound, match="choose one"):
        rt.model()
    with pytest.raises(NotFound, match="'nope' is not in"):
        rt.model("nope")
    with pytest.raises(InvalidInput, match="appears twice"):
        rt.load([cpu_middle.path])


def test_loaded_model_properties(cpu_middle):
    model = load(cpu_middle.path)
    assert model.input_names == ["x"] and model.output_names == ["y"]
    assert list(model.output_properties[0].valid_shape) == [1, 8, 16, 16]
    assert model.output_properties[0].tensor_type == model_pb2.HB_DNN_TENSOR_TYPE_F32
    assert [s.name for s in model.steps] == cpu_middle.step_names()
    out = model.run([np.zeros((1, 3, 16, 16), np.float32)])
    assert set(model.output_by_name(out)) == {"y"}


# --- DequantizeStep against onnxruntime's DequantizeLinear ---------------------------------

def _ort_dequantize(q, scale, zp, axis):
    elem = {np.dtype("int8"): TensorProto.INT8, np.dtype("int32"): TensorProto.INT32}[q.dtype]
    inits = [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")]
    attrs = {"axis": axis} if scale.ndim else {}
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs)
    graph = helper.make_graph([node], "dq", [helper.make_tensor_value_info("q", elem, list(q.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(q.shape))], initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    sess = ort.InferenceSession(m.SerializeToString(), session_options(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"q": q})[0]


@pytest.mark.parametrize("dtype", ["int8", "int32"])
@pytest.mark.parametrize("axis", [None, 0, 1, 3, -1], ids=lambda a: "per_tensor" if a is None else f"axis{a}")
def test_dequantize_step_equals_onnxruntime(dtype, axis, rng):
    shape = (2, 5, 3, 7)
    if dtype == "int8":
        q = rng.integers(-128, 128, shape).astype(np.int8)
    else:
        q = rng.integers(-(2**31), 2**31 - 1, shape, dtype=np.int64).astype(np.int32)
        q.flat[:4] = [-(2**31), 2**31 - 1, 0, -1]
    n = 1 if axis is None else shape[axis]
    scale = (rng.uniform(1e-4, 0.1, n) * rng.choice([1, 3.3, 1e-3], n)).astype(np.float32)
    if dtype == "int8":
        zp = rng.integers(-30, 31, n).astype(np.int8)
    else:
        zp = np.zeros(n, np.int32)  # int32 tensors (biases, accumulators) are symmetric
    if axis is None:
        scale, zp = scale.reshape(()), zp.reshape(())
    spec = model_pb2.PlanStep(
        kind=Kind.DEQUANTIZE, name="out_HzDequantize", inputs=["q"], outputs=["y"],
        scale=scale.reshape(-1).tolist(), zero_point=zp.reshape(-1).astype(np.int64).tolist(),
        axis=1 if axis is None else axis,
    )
    tensors = {"q": q}
    DequantizeStep(spec).run(tensors)
    want = _ort_dequantize(q, scale, zp, axis)
    assert tensors["y"].dtype == np.float32 and tensors["y"].shape == shape
    assert np.array_equal(tensors["y"], want)


def test_dequantize_step_with_int32_zero_point(rng):
    q = rng.integers(-(2**20), 2**20, (1, 4, 3, 3)).astype(np.int32)
    scale = rng.uniform(1e-4, 1e-2, 4).astype(np.float32)
    zp = rng.integers(-1000, 1000, 4).astype(np.int32)
    spec = model_pb2.PlanStep(kind=Kind.DEQUANTIZE, name="d", inputs=["q"], outputs=["y"],
                              scale=scale.tolist(), zero_point=zp.tolist(), axis=1)
    tensors = {"q": q}
    DequantizeStep(spec).run(tensors)
    assert np.array_equal(tensors["y"], _ort_dequantize(q, scale, zp, 1))


def test_runtime_and_references_share_session_options():
    opts = session_options()
    for key, value in SESSION_CONFIG.items():
        assert opts.get_session_config_entry(key) == value
    assert SESSION_CONFIG["session.disable_quant_qdq"] == "1"
    assert opts.intra_op_num_threads == 1


# --- the frame loop (hrt_model_exec infer in-process, the daemon's Infer and data channel) -----------

def test_run_frames_returns_the_last_frame_and_every_latency(cpu_middle, rng):
    model = load(cpu_middle.path)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    frames = []
    result = run_frames(model, [x], frame_count=3, dump_intermediate=True, on_frame=lambda: frames.append(1))
    assert len(result.latency_ms) == 3 and len(frames) == 3 and all(t > 0 for t in result.latency_ms)
    assert list(result.outputs) == model.output_names
    assert_bit_exact(list(result.outputs.values()), model.run([x]))
    assert result.intermediates and not any(k.startswith("rt:") for k in result.intermediates)


def test_run_frames_stops_when_the_caller_goes_away(cpu_middle, rng):
    model = load(cpu_middle.path)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    result = run_frames(model, [x], frame_count=50, is_active=lambda: False)
    assert len(result.latency_ms) == 1 and result.outputs == {}
