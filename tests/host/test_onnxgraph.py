"""The ONNX graph toolkit (bpuemu.host.onnxgraph) on tiny graphs built with onnx.helper."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.host.onnxgraph import (
    GraphIndex, attr, constants_to_initializers, convert_opset, default_opset, feed_for, graph_inputs, has_qdq, load_onnx,
    name_nodes, open_session, tensor_infos, value_infos, with_outputs,
)


def chain(opset: int = 13) -> onnx.ModelProto:
    """x -> Relu -> a -> Mul(a, a) -> b -> Sigmoid -> y, plus an initializer-fed Add reading a."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Mul", ["a", "a"], ["b"]),  # unnamed, reads a twice
        helper.make_node("Add", ["a", "bias"], ["c"], name="add"),
        helper.make_node("Sigmoid", ["b"], ["y"], name="sig"),
    ]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 4])],
        initializer=[numpy_helper.from_array(np.full((1, 4), 0.5, np.float32), "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def quantized() -> onnx.ModelProto:
    """x -> QuantizeLinear -> int8 q -> DequantizeLinear -> y."""
    s = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    z = numpy_helper.from_array(np.array(0, np.int8), "z")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], initializer=[s, z])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_index_producers_consumers_and_inputs():
    m = chain()
    idx = GraphIndex(m)
    assert idx.inputs == ["x"]                       # the initializer is not a model input
    assert idx.outputs == ["y", "c"]
    assert idx.producer["b"].op_type == "Mul"
    assert "x" not in idx.producer and "bias" not in idx.producer
    assert [(n.op_type, k) for n, k in idx.consumers["a"]] == [("Mul", 0), ("Mul", 1), ("Add", 0)]
    assert [n.op_type for n in idx.readers("a")] == ["Mul", "Mul", "Add"]
    assert idx.readers("y") == []
    assert idx.position["sig"] == 3
    np.testing.assert_array_equal(idx.const("bias"), np.full((1, 4), 0.5, np.float32))


def test_graph_inputs_leave_out_weights_listed_as_inputs():
    m = chain()
    m.graph.input.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 4]))  # an old exporter's habit
    assert [vi.name for vi in m.graph.input] == ["x", "bias"]
    assert [vi.name for vi in graph_inputs(m)] == ["x"]
    assert GraphIndex(m).inputs == ["x"]


def test_name_nodes_names_only_the_unnamed():
    m = chain()
    name_nodes(m)
    assert [n.name for n in m.graph.node] == ["relu", "Mul_1", "add", "sig"]


def test_attr_reads_a_value_or_the_default():
    n = helper.make_node("Conv", ["x", "w"], ["y"], group=4, kernel_shape=[3, 3])
    assert attr(n, "group") == 4 and attr(n, "kernel_shape") == [3, 3] and attr(n, "pads", "none") == "none"


def test_opset_and_constants():
    m = chain(opset=11)
    assert default_opset(m) == 11
    converted = convert_opset(m, 13)
    assert default_opset(converted) == 13 and default_opset(m) == 11
    assert convert_opset(converted, 13) is converted  # already there: the model itself
    const = helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32(2.0).reshape(1)))
    m.graph.node.insert(0, const)
    constants_to_initializers(m)
    assert "Constant" not in {n.op_type for n in m.graph.node}
    assert {t.name for t in m.graph.initializer} == {"bias", "k"}
    assert not has_qdq(chain()) and has_qdq(quantized())


def test_tensor_types_and_shapes():
    m = quantized()
    infos = tensor_infos(m)
    assert infos["q"].elem_type == TensorProto.INT8 and not infos["q"].is_float
    assert infos["y"].is_float and infos["y"].shape == [1, 4]
    vis = value_infos(m)
    assert vis["q"].type.tensor_type.elem_type == TensorProto.INT8
    assert "s" not in vis  # initializers are not value infos


def test_with_outputs_adds_intermediates_to_a_copy():
    m = quantized()
    typed = with_outputs(m, ["q", "y", "x"], tensor_infos(m))
    assert [o.name for o in typed.graph.output] == ["y", "q"]  # inputs and outputs are not added again
    assert typed.graph.output[1].type.tensor_type.elem_type == TensorProto.INT8
    assert [o.name for o in m.graph.output] == ["y"]          # the caller's model is unchanged
    untyped = with_outputs(m, ["q"])
    assert not untyped.graph.output[1].type.HasField("tensor_type")
    x = np.array([[0.12, -0.3, 5.0, 20.0]], np.float32)
    for model in (typed, untyped):
        sess = open_session(model)
        y, q = sess.run(["y", "q"], {"x": x})
        assert q.dtype == np.int8 and q.tolist() == [[1, -3, 50, 127]]


def test_sessions_use_the_board_options_unless_told_otherwise():
    """The board's session options (QDQ fusion off) by default; onnxruntime's own only when asked."""
    import onnxruntime as ort

    from bpuemu.board.runtime.sessions import SESSION_CONFIG

    board = open_session(chain())
    opts = board.get_session_options()
    for key, value in SESSION_CONFIG.items():
        assert opts.get_session_config_entry(key) == value
    assert opts.intra_op_num_threads == 1
    assert open_session(chain(), intra_op_threads=2).get_session_options().intra_op_num_threads == 2
    stock = open_session(chain(), board_options=False).get_session_options()
    with pytest.raises(RuntimeError, match="does not have configuration"):
        stock.get_session_config_entry("session.disable_quant_qdq")  # onnxruntime's defaults: fusion on
    own = ort.SessionOptions()
    own.add_session_config_entry("session.disable_quant_qdq", "0")
    assert open_session(chain(), own, board_options=False).get_session_options().get_session_config_entry(
        "session.disable_quant_qdq") == "0"
    with pytest.raises(ValueError):
        open_session(chain(), own)  # options are the board's unless the caller says otherwise
    x = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)
    y, c = board.run(None, {"x": x})
    a = np.maximum(x, 0)
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-a * a)), rtol=1e-6)
    np.testing.assert_allclose(c, a + 0.5)


def test_open_session_refuses_a_broken_model_with_one_error():
    m = chain()
    m.graph.node[1].op_type = "NoSuchOp"
    with pytest.raises(InvalidInput, match="onnxruntime cannot load the probe model"):
        open_session(m, what="the probe model")
    with pytest.raises(InvalidInput, match="onnxruntime cannot load"):
        open_session(b"not a model")


def test_feed_for_casts_to_the_session_inputs():
    s = numpy_helper.from_array(np.array(1.0, np.float32), "s")
    z = numpy_helper.from_array(np.array(0, np.int8), "z")
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])], "int8in",
                              [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], initializer=[s, z])
    sess = open_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    feed = feed_for(sess, {"x": np.array([[-200.0, 3.4, 126.6]])})
    assert feed["x"].dtype == np.int8 and feed["x"].tolist() == [[-128, 3, 127]]
    with pytest.raises(InvalidInput, match="no data for input 'x'"):
        feed_for(sess, {"other": np.zeros(3)})


def test_load_onnx_errors(tmp_path):
    with pytest.raises(NotFound, match="onnx_model not found"):
        load_onnx(str(tmp_path / "missing.onnx"), "onnx_model")
    with pytest.raises(InvalidInput, match="is a directory"):
        load_onnx(str(tmp_path))
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(InvalidInput, match="is not a readable ONNX model"):
        load_onnx(str(bad))
    good = tmp_path / "good.onnx"
    onnx.save(chain(), str(good))
    assert [n.op_type for n in load_onnx(str(good)).graph.node] == ["Relu", "Mul", "Add", "Sigmoid"]


def test_parts_give_every_tensor_of_one_run_bit_identical_part_by_part():
    """A model with every activation out, cut into parts (onnxgraph.Parts): each wanted tensor comes
    once, in graph order, equal bit for bit to one whole run; the tensors a layout-sensitive node
    (an average pool) reads never cross a cut; a carried tensor is freed after its last reader."""
    from quant_models import zoo_model

    from bpuemu.host.onnxgraph import Parts

    m = zoo_model(size=32)
    infos = tensor_infos(m)
    names = [o for n in m.graph.node for o in n.output if infos[o].is_float]
    whole = with_outputs(m, names, infos)
    x = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    expected = dict(zip(names, open_session(whole).run(names, {"x": x})))
    parts = Parts(whole, names, infos, budget=1).open(lambda p: open_session(p, arena="shared"))
    assert len(parts) > 2
    got = []
    for values in parts.iter_run(feed_for(parts, {"x": x})):
        got.extend(values.items())
    assert [t for t, _ in got] == names                       # each once, in graph order
    for t, v in got:
        assert v.dtype == expected[t].dtype and np.array_equal(v, expected[t]), t
    readers = {i: n.op_type for n in m.graph.node for i in n.input}
    for p in parts.parts[1:]:
        assert not [t for t in p.inputs if readers.get(t) in ("AveragePool", "GlobalAveragePool")], p.inputs
    assert all(t in p.drop for p in parts.parts for t in p.inputs if t != "x" and p is max(
        (q for q in parts.parts if t in q.inputs), key=parts.parts.index))
    assert len(Parts(whole, names, infos, budget=1 << 40)) == 1   # within the budget: the whole model


def test_a_model_over_the_budget_is_cut_into_cache_sized_parts(monkeypatch):
    """A model whose wanted tensors take more than the budget is cut into parts of CUT_BYTES (each
    part's outputs still in the core's cache when they are reduced), not of the budget; one within
    the budget stays whole."""
    from quant_models import zoo_model

    from bpuemu.host.onnxgraph import parts as P

    m = zoo_model(size=32)
    infos = tensor_infos(m)
    names = [o for n in m.graph.node for o in n.output if infos[o].is_float]
    whole = with_outputs(m, names, infos)
    total = sum(P.tensor_bytes(infos[t]) for t in names)
    finest = len(P.Parts(whole, names, infos, budget=1))
    assert finest > 2
    monkeypatch.setattr(P, "CUT_BYTES", 1)
    assert len(P.Parts(whole, names, infos, budget=total - 1)) == finest   # over the budget: CUT_BYTES parts
    assert len(P.Parts(whole, names, infos, budget=total)) == 1            # within it: whole
    monkeypatch.setattr(P, "CUT_BYTES", 1 << 40)
    assert len(P.Parts(whole, names, infos, budget=total - 1)) <= 2        # parts of the budget


def test_imap_samples_yields_in_order_with_a_bounded_lookahead():
    """Results come in sample order as they are ready, and the workers run at most 2 x workers
    samples ahead of the caller: a caller adding results up never holds every sample's."""
    import threading
    import time

    from bpuemu.host.onnxgraph import imap_samples

    sess = open_session(chain())
    samples = [{"x": np.full((1, 4), i, np.float32)} for i in range(12)]
    done, lock = [], threading.Lock()

    def fn(i, outs):
        with lock:
            done.append(i)
        return i, float(outs[1][0, 0])

    got = []
    for i, c in imap_samples(sess, ["y", "c"], samples, fn, workers=2):
        time.sleep(0.02)                     # a slow caller: the workers must wait for it
        with lock:
            ahead = len(done) - len(got)
        got.append((i, c))
        assert ahead <= 5, ahead           # the one handed over and 2 x workers in flight
    assert got == [(i, i + 0.5) for i in range(12)]


def test_sessions_choose_where_their_tensors_live():
    """arena="session" (onnxruntime's own arena per session), "shared" (one arena for the sessions
    that ask for it, onnxruntime's environment allocator), "none": the same values."""
    from bpuemu.host.onnxgraph.session import shared_arena

    x = np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)
    own, shared, none = (open_session(chain(), arena=a) for a in ("session", "shared", "none"))
    assert shared_arena()
    assert shared.get_session_options().get_session_config_entry("session.use_env_allocators") == "1"
    assert own.get_session_options().enable_cpu_mem_arena and not none.get_session_options().enable_cpu_mem_arena
    expected = own.run(None, {"x": x})
    for s in (shared, none):
        assert all(np.array_equal(a, b) for a, b in zip(s.run(None, {"x": x}), expected))
