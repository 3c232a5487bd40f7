"""ptq_faq_j6 "How to use unitconv operator to optimize model performance?": the FAQ's conv+reshape+concat
model output, with and without a unitconv after the Concat (bpuemu's quant_config node_config unitconv)."""
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from bpuemu.common.errors import InvalidInput

from j6_helpers import bin_devices, conv_reshape_concat, convert, model_of, nodes, weight


def _cpu_ops(art):
    return sorted(n.name for n in art.nodes if n.on == "CPU")


def _subgraphs(art):
    return len({n.subgraph for n in art.nodes if n.subgraph is not None})


@pytest.mark.parametrize("march", ["nash-e", "nash-p"])
def test_a_unitconv_after_the_tail_concat_moves_it_onto_the_bpu_at_some_accuracy(tmp_path, march):
    default, _ = convert(tmp_path, conv_reshape_concat(), march=march, name="default", samples=6)
    placed = nodes(default)
    assert _cpu_ops(default) == ["concat", "reshape_a", "reshape_b"]            # the FAQ's default
    assert placed["conv_a"].output_dtype == placed["conv_b"].output_dtype == ("int32" if march == "nash-e" else "float32")

    with_unitconv, _ = convert(tmp_path, conv_reshape_concat(), march=march, name="unitconv", samples=6,
                               quant_config={"node_config": {"concat": {"unitconv": "after"}}})
    placed = nodes(with_unitconv)
    assert _cpu_ops(with_unitconv) == []                                         # the whole structure on the BPU
    assert placed["concat"].on == "BPU" and placed["concat"].output_dtype == "int8"
    assert placed["conv_a"].output_dtype == "int8"                               # compressed before the unitconv
    assert placed["concat_unitconv"].output_dtype == ("int32" if march == "nash-e" else "float32")
    assert _subgraphs(with_unitconv) <= _subgraphs(default)
    devices = bin_devices(with_unitconv.bin)
    assert devices["concat"] == devices["reshape_a"] == devices["concat_unitconv"] == "BPU"
    # the trade: the output's cosine to the float model is lower or equal
    assert with_unitconv.output_cosines["y"] <= default.output_cosines["y"]
    # the unitconv is an identity: the float model's output is the same
    from bpuemu.host.hb_onnxruntime import HB_ONNXRuntime

    x = np.random.default_rng(9).standard_normal((1, 3, 8, 8)).astype(np.float32)
    a = HB_ONNXRuntime(default.original).run(None, {"x": x})[0]
    b = HB_ONNXRuntime(with_unitconv.original).run(None, {"x": x})[0]
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert any(n.name == "concat_unitconv" for n in onnx.load(with_unitconv.original).graph.node)


def test_a_unitconv_on_a_tensor_that_is_not_4d_is_one_line(tmp_path):
    m = model_of([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                  helper.make_node("Flatten", ["c"], ["y"], name="flatten")], {"x": [1, 3, 4, 4]}, ["y"],
                 [weight("w", (2, 3, 1, 1))])
    with pytest.raises(InvalidInput, match="unitconv after node flatten: tensor 'y' is not a 4-D float"):
        convert(tmp_path, m, quant_config={"node_config": {"flatten": {"unitconv": "after"}}})


def test_a_unitconv_before_a_passive_op_at_the_model_head_moves_it_onto_the_bpu(tmp_path):
    """The FAQ's other end: a Transpose reading the model input has no threshold of its own (CPU); a
    unitconv before it gives it one."""
    m = model_of([helper.make_node("Transpose", ["x"], ["t"], name="transpose", perm=[0, 1, 3, 2]),
                  helper.make_node("Conv", ["t", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", ["c"], ["r"], name="relu"),
                  helper.make_node("Conv", ["r", "w2"], ["y"], name="conv_out")],
                 {"x": [1, 3, 8, 8]}, ["y"], [weight("w", (4, 3, 3, 3), 1), weight("w2", (4, 4, 1, 1), 2)])
    default, _ = convert(tmp_path, m, name="default")
    assert nodes(default)["transpose"].on == "CPU" and nodes(default)["transpose"].reason.startswith("passive")
    moved, _ = convert(tmp_path, m, name="unitconv", quant_config={"node_config": {"transpose": {"unitconv": "before"}}})
    assert nodes(moved)["transpose"].on == "BPU" and nodes(moved)["transpose_unitconv"].on == "BPU"
    assert _cpu_ops(moved) == [] and _subgraphs(moved) == 1
    assert bin_devices(moved.bin)["transpose"] == "BPU"
