"""BPU/CPU placement (bpuemu.host.compiler.placement): the op table decides, the caller's model is untouched."""
import dataclasses

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from bpuemu.host.compiler.optable import BPU_OPS
from bpuemu.host.compiler.placement import place


def _two_tails():
    """x -> Conv -> Relu -> y1 (model output); x -> Flatten -> MatMul -> Relu -> y2; all nodes unnamed."""
    w = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")
    m = numpy_helper.from_array(np.ones((48, 5), np.float32), "m")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Relu", ["c"], ["y1"]),
        helper.make_node("Flatten", ["x"], ["f"]),
        helper.make_node("MatMul", ["f", "m"], ["mm"]),
        helper.make_node("Relu", ["mm"], ["y2"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, [1, 4, 4, 4]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 5])], [w, m])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_place_leaves_the_callers_model_unchanged():
    model = _two_tails()
    before = model.SerializeToString()
    placement = place(model, quantized_inputs=["x"])
    assert model.SerializeToString() == before
    assert [n.name for n in placement.nodes] == ["Conv_0", "Relu_1", "Flatten_2", "MatMul_3", "Relu_4"]


def test_tail_rule_follows_the_op_table(monkeypatch):
    on = {n.name: n.on for n in place(_two_tails(), quantized_inputs=["x"]).nodes}
    assert on["Relu_1"] == "CPU"  # after a Conv (int32 output) at the model tail
    assert on["Relu_4"] == "BPU"  # MatMul does not output int32
    monkeypatch.setitem(BPU_OPS, "MatMul", dataclasses.replace(BPU_OPS["MatMul"], int32_output=True))
    on = {n.name: n.on for n in place(_two_tails(), quantized_inputs=["x"]).nodes}
    assert on["Relu_4"] == "CPU"
