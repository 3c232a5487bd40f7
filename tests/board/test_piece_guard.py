"""A model is data (bpuemu.board.runtime.piece_guard): every place ONNX lets a tensor keep its bytes in a file
is found, at any depth, and the schema the board reads pieces with has onnx.proto's field numbers."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bpuemu.board.runtime.piece_guard import SCHEMA, check_piece
from bpuemu.board.runtime.sessions import session_from_bytes
from bpuemu.common.errors import InvalidModelFile


def _external(name: str = "w") -> TensorProto:
    t = numpy_helper.from_array(np.zeros(4, np.float32), name)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "token.txt"), ("length", "16")):
        e = t.external_data.add()
        e.key, e.value = key, value
    return t


def _io():
    return ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])


def _graph(nodes, initializers=(), sparse=(), name="main"):
    inputs, outputs = _io()
    g = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    g.sparse_initializer.extend(sparse)
    return g


def _sparse() -> onnx.SparseTensorProto:
    s = onnx.SparseTensorProto()
    s.values.CopyFrom(_external("sv"))
    s.indices.CopyFrom(numpy_helper.from_array(np.arange(4, dtype=np.int64), "si"))
    s.dims.extend([8])
    return s


def _model_with(where: str) -> onnx.ModelProto:
    relu = helper.make_node("Relu", ["x"], ["y"])
    if where == "initializer":
        return helper.make_model(_graph([relu], [_external()]))
    if where == "sparse_initializer":
        return helper.make_model(_graph([relu], sparse=[_sparse()]))
    if where == "constant_value":
        return helper.make_model(_graph([helper.make_node("Constant", [], ["c"], value=_external()), relu]))
    if where == "attribute_tensors":
        node = helper.make_node("Relu", ["x"], ["y"])
        node.attribute.append(helper.make_attribute("extra", [_external("a"), _external("b")]))
        return helper.make_model(_graph([node]))
    if where == "if_branch_two_deep":
        inner = _graph([helper.make_node("Constant", [], ["y"], value=_external())], name="inner")
        mid = _graph([helper.make_node("If", ["x"], ["y"], then_branch=inner, else_branch=inner)], name="mid")
        return helper.make_model(_graph([helper.make_node("If", ["x"], ["y"], then_branch=mid, else_branch=mid)]))
    if where == "loop_body_initializer":
        body = _graph([relu], [_external()], name="body")
        return helper.make_model(_graph([helper.make_node("Loop", ["", "", "x"], ["y"], body=body)]))
    if where == "function_node":
        f = helper.make_function("local", "f", ["x"], ["y"],
                                 [helper.make_node("Constant", [], ["y"], value=_external())],
                                 [helper.make_opsetid("", 17)])
        m = helper.make_model(_graph([helper.make_node("f", ["x"], ["y"], domain="local")]), functions=[f])
        return m
    if where == "training_info":
        m = helper.make_model(_graph([relu]))
        m.training_info.add().initialization.CopyFrom(_graph([relu], [_external()], name="init"))
        return m
    raise AssertionError(where)


PLACES = ["initializer", "sparse_initializer", "constant_value", "attribute_tensors", "if_branch_two_deep",
          "loop_body_initializer", "function_node", "training_info"]


@pytest.mark.parametrize("where", PLACES)
def test_external_data_is_refused_wherever_a_tensor_sits(where):
    blob = _model_with(where).SerializeToString()
    with pytest.raises(InvalidModelFile) as refused:
        check_piece(blob, "step 's'")
    message = str(refused.value).splitlines()[0]
    assert message.startswith("step 's': tensor '") and "external data" in message and "token.txt" in message
    with pytest.raises(InvalidModelFile):  # every session the runtime opens goes through the check
        session_from_bytes(blob)


def test_a_tensor_with_external_data_entries_but_no_location_flag_is_refused():
    t = _external()
    t.data_location = TensorProto.DEFAULT
    with pytest.raises(InvalidModelFile, match="tensor 'w'"):
        check_piece(helper.make_model(_graph([helper.make_node("Relu", ["x"], ["y"])], [t])).SerializeToString(), "p")


def test_a_model_holding_its_data_passes_and_runs():
    w = numpy_helper.from_array(np.full(4, 2, np.float32), "w")
    m = helper.make_model(_graph([helper.make_node("Add", ["x", "w"], ["y"])], [w]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    check_piece(m.SerializeToString(), "p")
    y = session_from_bytes(m.SerializeToString()).run(None, {"x": np.ones(4, np.float32)})[0]
    assert np.array_equal(y, np.full(4, 3, np.float32))


def test_bytes_that_are_not_onnx_are_refused():
    with pytest.raises(InvalidModelFile, match="not a valid ONNX model"):
        check_piece(b"\x00\x00\x00\x00ORTM" + b"\xff" * 64, "p")


def test_the_schema_has_onnx_protos_field_numbers():
    from onnx import onnx_ml_pb2

    for message, fields in SCHEMA.items():
        descriptor = getattr(onnx_ml_pb2, message + "Proto").DESCRIPTOR
        for name, number, _, _ in fields:
            assert descriptor.fields_by_name[name].number == number, (message, name)
