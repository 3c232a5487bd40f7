"""Consecutive onnxruntime pieces of a plan run as one session on frames without dumps (board/runtime/merge).

The merged frame must give, bit for bit, what the pieces give one by one (and so what the whole quantized
model gives); dumps and profiled frames still run the pieces one by one and see every tensor between them.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bpuemu.board.runtime import PerfConfig, Runtime, run_frames, run_perf
from bpuemu.board.runtime.merge import merge_pieces
from bpuemu.board.runtime.model import LoadedModel, MergedStep, OrtStep
from bpuemu.board.runtime.profiler import FrameTimes
from bpuemu.board.runtime.sessions import session_from_bytes
from bpuemu.common.container import read_bin
from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import rt_shape
from bpuemu.host import samples
from helpers import models as M


def _models(path):
    binfile = read_bin(path)
    m = binfile.model()
    return LoadedModel(m, binfile.blobs), LoadedModel(m, binfile.blobs, merge=False)


def test_the_pieces_of_a_frame_run_as_one_session_bit_for_bit(cpu_middle, rng):
    merged, one_by_one = _models(cpu_middle.path)
    runs = [s for s in merged._frame_steps if isinstance(s, MergedStep)]
    assert len(runs) == 1 and len(runs[0].steps) == 4       # HzQuantize, subgraph 0, Softmax, subgraph 1
    assert not any(isinstance(s, OrtStep) for s in merged._frame_steps)
    ref = M.reference_session(cpu_middle.qmodel)
    for _ in range(3):
        x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
        got, want = merged.run([x]), one_by_one.run([x])
        for g, w, r in zip(got, want, ref.run(None, {"x": x})):
            assert g.dtype == w.dtype == r.dtype and np.array_equal(g, w) and np.array_equal(g, r)


def test_dumps_and_profiled_frames_still_see_every_piece(cpu_middle, rng):
    merged, one_by_one = _models(cpu_middle.path)
    pieces = next(s for s in merged._frame_steps if isinstance(s, MergedStep)).steps
    assert all(p.session is None for p in pieces)    # the merged session holds the weights once, until a dump
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    merged.run([x])
    assert all(p.session is None for p in pieces)
    out, inter = merged.run([x], keep_intermediate=True)
    assert all(p.session is None for p in pieces)    # opened for the dump, closed after it
    out_b, inter_b = one_by_one.run([x], keep_intermediate=True)
    assert inter.keys() == inter_b.keys() and "Softmax_mid" not in inter       # tensors, not steps
    assert all(np.array_equal(inter[k], inter_b[k]) for k in inter)
    assert {o for s in cpu_middle.model.plan for o in s.outputs} <= inter.keys()
    times = FrameTimes()
    merged.run([x], times=times)
    assert [name for name, _, _ in times.steps] == [s.name for s in cpu_middle.model.plan]


def _sessions(model):
    """The onnxruntime sessions ``model`` holds open: its frame's steps' and the pieces'."""
    return [s.session for s in model._frame_steps + model._closed if getattr(s, "session", None) is not None]


def test_after_a_dump_or_a_profiled_perf_job_the_model_holds_only_the_merged_session_again(cpu_middle, rng):
    model, _ = _models(cpu_middle.path)
    merged_only = _sessions(model)
    assert merged_only == [s.session for s in model._frame_steps if isinstance(s, MergedStep)] and merged_only
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    first = run_frames(model, [x], frame_count=2, dump_intermediate=True)
    assert _sessions(model) == merged_only, "the pieces' sessions stayed open after a dumped infer"
    report = run_perf(model, [x], PerfConfig(frame_count=4, thread_num=2, profile=True))
    assert "Softmax_mid" in report.profiler_csv
    assert _sessions(model) == merged_only, "the pieces' sessions stayed open after a profiled perf job"
    again = run_frames(model, [x], dump_intermediate=True)     # the pieces open again for the next dump
    assert _sessions(model) == merged_only
    for got, want in ((again.outputs, first.outputs), (again.intermediates, first.intermediates)):
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in got)
    assert {o for s in cpu_middle.model.plan for o in s.outputs} <= again.intermediates.keys()
    # Another dumped or profiled frame under way (its open_pieces not yet closed): a dump that ends beside
    # it leaves the sessions that frame runs open; they close when it ends.
    model.open_pieces()
    run_frames(model, [x], dump_intermediate=True)
    assert all(p.session is not None for p in model._closed)
    model.run([x], times=FrameTimes())
    model.close_pieces()
    assert _sessions(model) == merged_only


def test_the_sample_cnn_and_its_softmax_run_as_one_session(tmp_path, rng):
    path, quantized = tmp_path / "m.bin", tmp_path / "q.onnx"
    samples.sample_bin(str(path), "rgb", "NHWC", 32, 32, quantized_path=str(quantized))
    rt = Runtime()
    rt.load(str(path))
    model = rt.model()
    assert [type(s).__name__ for s in model._frame_steps] == ["PreprocessStep", "MergedStep"]
    ref = M.reference_session(onnx.load(str(quantized)))
    spec = read_bin(str(path)).model().input_specs[0]
    for _ in range(3):
        x = rng.integers(0, 256, rt_shape(spec), dtype=np.uint8)
        ready = np.ascontiguousarray((x ^ np.uint8(0x80)).view(np.int8).transpose(0, 3, 1, 2))
        got, want = model.run([x]), ref.run(None, {"data": ready})
        assert all(g.dtype == w.dtype and np.array_equal(g, w) for g, w in zip(got, want))


# --- merge_pieces on pieces made by hand -----------------------------------------------

def _piece(nodes, inputs, outputs, inits, opset=13):
    graph = helper.make_graph(nodes, "piece", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _two_pieces():
    """a = (x * k1 + one) then b = (a * k2 + one) * x, where both pieces call their internal tensor 't', their
    nodes 'mul' and 'add', their different factors 'k' and their identical constants 'one'."""
    k1, k2 = [[1.5, -2.0, 3.0]], [[0.25, 4.0, -1.0]]
    first = _piece([helper.make_node("Mul", ["x", "k"], ["t"], name="mul"), helper.make_node("Add", ["t", "one"], ["a"], name="add")],
                   ["x"], ["a"], {"k": k1, "one": [[1.0, 1.0, 1.0]]})
    second = _piece([helper.make_node("Mul", ["a", "k"], ["t"], name="mul"), helper.make_node("Add", ["t", "one"], ["u"], name="add"),
                     helper.make_node("Mul", ["u", "x"], ["b"], name="times_x")],
                    ["a", "x"], ["b"], {"k": k2, "one": [[1.0, 1.0, 1.0]]})
    return first, second


def test_pieces_repeating_internal_names_merge_by_renaming(rng):
    first, second = _two_pieces()
    blob = merge_pieces([first, second], ["a", "b"])
    assert blob is not None
    g = onnx.load_from_string(blob).graph
    assert [i.name for i in g.input] == ["x"] and [o.name for o in g.output] == ["a", "b"]
    assert sorted(t.name for t in g.initializer) == ["k", "k__merged1", "one"]    # the same 'one' once
    assert len({n.name for n in g.node}) == len(g.node) == 5
    x = rng.standard_normal((2, 3)).astype(np.float32)
    a = session_from_bytes(first).run(None, {"x": x})[0]
    b = session_from_bytes(second).run(None, {"a": a, "x": x})[0]
    got_a, got_b = session_from_bytes(blob).run(None, {"x": x})
    assert np.array_equal(got_a, a) and np.array_equal(got_b, b)


def test_pieces_that_need_more_than_renaming_are_not_merged():
    first, second = _two_pieces()
    assert merge_pieces([first, _piece([helper.make_node("Mul", ["a", "a"], ["b"])], ["a"], ["b"], {}, opset=17)],
                        ["b"]) is None                                              # another opset version
    branch = helper.make_graph([helper.make_node("Identity", ["a"], ["y"])], "branch", [],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    cond = helper.make_node("If", ["c"], ["b"], then_branch=branch, else_branch=branch)
    with_if = _piece([cond], ["a"], ["b"], {})
    assert merge_pieces([first, with_if], ["b"]) is None                            # a subgraph reading outer names
    assert merge_pieces([first, second], ["t"]) is None                             # not an output of a piece


def test_a_plan_whose_pieces_cannot_merge_runs_them_one_by_one(cpu_middle, monkeypatch, rng):
    import bpuemu.board.runtime.model as model_module

    monkeypatch.setattr(model_module, "merge_pieces", lambda blobs, outputs: None)
    merged, _ = _models(cpu_middle.path)
    assert not any(isinstance(s, MergedStep) for s in merged._frame_steps)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    want = M.reference_session(cpu_middle.qmodel).run(None, {"x": x})
    assert all(np.array_equal(g, w) for g, w in zip(merged.run([x]), want))


def test_a_frame_of_input_checks_and_one_session_runs_without_the_tensor_table(tmp_path, rng):
    path = tmp_path / "m.bin"
    samples.sample_bin(str(path), "bgr", "NHWC", 32, 32)
    binfile = read_bin(str(path))
    model = LoadedModel(binfile.model(), binfile.blobs)
    assert isinstance(model._direct, MergedStep)
    one_by_one = LoadedModel(binfile.model(), binfile.blobs, merge=False)
    assert one_by_one._direct is None                 # the Softmax after the subgraph: two steps
    spec = binfile.model().input_specs[0]
    x = rng.integers(0, 256, rt_shape(spec), dtype=np.uint8)
    got, want = model.run([x]), one_by_one.run([x])
    assert all(g.dtype == w.dtype and np.array_equal(g, w) for g, w in zip(got, want))
    with pytest.raises(InvalidInput, match="must be uint8"):   # the input is still checked
        model.run([x.astype(np.float32)])
    with pytest.raises(InvalidInput, match="needs 3072 bytes"):
        model.run([x[:, :16]])


def _frames_checked_for_open_pieces(model):
    """``model`` whose every frame first checks that its pieces' sessions are already open (perf's and
    infer's latency clocks run around ``model.run``); the frames it ran are counted in ``model.checked``."""
    frame = model.run
    model.checked = 0

    def timed_frame(*args, **kwargs):
        assert all(p.session is not None for p in model._closed), "a piece's session opened inside a frame"
        model.checked += 1
        return frame(*args, **kwargs)

    model.run = timed_frame
    return model


def test_profiled_perf_and_dumps_open_the_pieces_before_their_clocks_start(cpu_middle, monkeypatch, rng):
    monkeypatch.setattr(OrtStep, "_reopen", lambda *a: pytest.fail("a piece's session opened inside a frame"))
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    want = M.reference_session(cpu_middle.qmodel).run(None, {"x": x})
    plan_outputs = {o for s in cpu_middle.model.plan for o in s.outputs}

    profiled, _ = _models(cpu_middle.path)
    assert profiled._closed and all(p.session is None for p in profiled._closed)
    report = run_perf(_frames_checked_for_open_pieces(profiled), [x], PerfConfig(frame_count=3, profile=True))
    assert "Softmax_mid" in report.profiler_csv and profiled.checked == 3

    dumped, _ = _models(cpu_middle.path)
    assert all(p.session is None for p in dumped._closed)
    result = run_frames(_frames_checked_for_open_pieces(dumped), [x], frame_count=2, dump_intermediate=True)
    assert dumped.checked == 2 and plan_outputs <= result.intermediates.keys()
    assert all(np.array_equal(result.outputs[o.name], w) for o, w in zip(cpu_middle.qmodel.graph.output, want))

    alone, _ = _models(cpu_middle.path)     # one profiled frame, no perf job around it: it opens them itself
    times = FrameTimes()
    got = alone.run([x], times=times)
    assert [name for name, _, _ in times.steps] == [s.name for s in cpu_middle.model.plan]
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
