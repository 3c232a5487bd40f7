"""quant_config (ptq_faq_j6, "quant_config qtype is set but does not take effect?"): parsing, node beats
op beats model, and every configured qtype either takes effect or the log names one of the FAQ's three
reasons for that node (the op's constraint, the tail rule, passive quantization)."""
import json
import logging

import numpy as np
import onnx
import pytest
from onnx import helper

from bpuemu.common.errors import InvalidInput
from bpuemu.common.march import march
from bpuemu.host.quant.quant_config import parse_quant_config

from j6_helpers import bin_devices, convert, model_of, nodes, transpose_between_convs, weight

#: The FAQ's shape of a quant_config: model defaults, per op type, per node.
FAQ_CONFIG = {
    "model_config": {"all_node_type": "int16", "activation": {"calibration_type": "max"}},
    "op_config": {"Conv": {"qtype": "int8"}},
    "node_config": {"conv_1": {"qtype": "int16"}},
}


def test_node_beats_op_beats_model():
    cfg = parse_quant_config(FAQ_CONFIG, march("nash-e"))
    assert cfg.resolve("conv_1", "Conv").qtype == "int16"            # node_config
    assert cfg.resolve("conv_1", "Conv").qtype_from == "node_config"
    assert cfg.resolve("conv_2", "Conv").qtype == "int8"             # op_config
    assert cfg.resolve("relu_1", "Relu").qtype == "int16"            # model_config all_node_type
    assert cfg.resolve("relu_1", "Relu").qtype_from == "model_config"
    assert cfg.model.calibration_type == "max"


def test_a_json_file_and_the_inline_mapping_are_the_same(tmp_path):
    path = tmp_path / "quant_config.json"
    path.write_text(json.dumps(FAQ_CONFIG))
    from_file = parse_quant_config(str(path), march("nash-e"))
    inline = parse_quant_config(FAQ_CONFIG, march("nash-e"))
    assert (from_file.model, dict(from_file.ops), dict(from_file.nodes)) == (inline.model, dict(inline.ops), dict(inline.nodes))


@pytest.mark.parametrize("config, words", [
    ({"model_config": {"all_node_typ": "int16"}}, "unknown key 'all_node_typ' in model_config (did you mean 'all_node_type'?)"),
    ({"op_config": {"Conv": {"qtype": "int4"}}}, "op_config.Conv: qtype on nash-e: 'int4' is not one of int8, int16, float16, float32"),
    ({"node_config": {"a": {"weight": {}}}}, "unknown key 'weight' in node_config.a"),
    ({"node_config": {"a": {"activation": {"calibration_type": "mix"}}}}, "calibration_type 'mix' is not one of kl, max"),
    ({"subgraph_config": {}}, "unknown key 'subgraph_config' in the top level"),
    ({"model_config": {"activation": {"max_percentile": 2}}}, "max_percentile should be a number in 0.5~1.0"),
    ({"op_config": ["Conv"]}, "op_config should be a mapping"),
])
def test_bad_config_is_one_line_naming_the_problem(config, words):
    with pytest.raises(InvalidInput) as exc:
        parse_quant_config(config, march("nash-e"))
    assert words in exc.value.message and "\n" not in exc.value.message


def test_qtypes_are_those_the_march_allows():
    with pytest.raises(InvalidInput, match="qtype on bayes-e: 'float16' is not one of int8, int16"):
        parse_quant_config({"op_config": {"Conv": {"qtype": "float16"}}}, march("bayes-e"))
    assert parse_quant_config({"op_config": {"Conv": {"qtype": "float16"}}}, march("nash-p")).ops["Conv"].qtype == "float16"


def test_bad_json_file_is_one_line(tmp_path):
    path = tmp_path / "q.json"
    path.write_text('{"model_config": {,}')
    with pytest.raises(InvalidInput, match=r"not valid JSON: .* at line 1 column 19"):
        parse_quant_config(str(path), march("nash-e"))
    with pytest.raises(InvalidInput, match="no such file"):
        parse_quant_config(str(tmp_path / "missing.json"), march("nash-e"))


# --- at the pipeline level ---------------------------------------------------------------------

def _conv_chain():
    """x -> conv_1 -> relu_1 -> conv_2 -> softmax -> y: two Convs, an activation, a Softmax at the tail."""
    return model_of([helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv_1", pads=[1, 1, 1, 1]),
                     helper.make_node("Relu", ["c1"], ["r1"], name="relu_1"),
                     helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv_2", pads=[1, 1, 1, 1]),
                     helper.make_node("Softmax", ["c2"], ["y"], name="softmax", axis=1)],
                    {"x": [1, 3, 8, 8]}, ["y"], [weight("w1", (8, 3, 3, 3), 1), weight("w2", (4, 8, 3, 3), 2)])


def test_a_node_the_model_does_not_have_is_an_error_and_an_op_type_a_warning(tmp_path, caplog):
    with pytest.raises(InvalidInput, match="node_config names 'conv_9', which is not a node of the model"):
        convert(tmp_path, _conv_chain(), quant_config={"node_config": {"conv_9": {"qtype": "int16"}}})
    with caplog.at_level(logging.WARNING):
        convert(tmp_path, _conv_chain(), quant_config={"op_config": {"GridSample": {"qtype": "int8"}}}, name="ok")
    assert "op_config names op type 'GridSample', which the model does not contain" in caplog.text


def test_int16_qtype_drives_quantization_per_node(tmp_path):
    """node_config int16 on conv_1: its output is int16 in the quantized model, conv_2's stays int8."""
    art, _ = convert(tmp_path, _conv_chain(), quant_config={"node_config": {"conv_1": {"qtype": "int16"}}})
    placed = nodes(art)
    assert placed["conv_1"].output_dtype == "int16" and placed["relu_1"].output_dtype == "int16"
    assert placed["conv_2"].on == "BPU"
    q = onnx.load(art.quantized)
    q_out = {n.input[0]: n for n in q.graph.node if n.op_type == "QuantizeLinear"}
    zp = {i.name: i for i in q.graph.initializer}
    assert zp[q_out["r1"].input[2]].data_type == onnx.TensorProto.INT16
    assert zp[q_out["x"].input[2]].data_type == onnx.TensorProto.INT8


def test_float32_qtype_runs_the_node_on_the_cpu_and_float16_where_the_bpu_lacks_it(tmp_path):
    art, _ = convert(tmp_path, _conv_chain(), quant_config={"node_config": {"conv_2": {"qtype": "float32"}},
                                                             "op_config": {"Relu": {"qtype": "float16"}}})
    placed = nodes(art)
    assert placed["conv_2"].on == "CPU" and "quant_config node_config qtype float32" in placed["conv_2"].reason
    assert placed["relu_1"].on == "CPU" and "nash-e's BPU has no float16" in placed["relu_1"].qtype_note
    assert bin_devices(art.bin)["conv_2"] == "CPU" and bin_devices(art.bin)["conv_1"] == "BPU"


def test_op_constraint_int16_softmax_falls_back_and_the_log_says_why(tmp_path, caplog):
    """qtype int16 on Softmax: the op table's int16 constraint keeps it int8; the log names the node."""
    with caplog.at_level(logging.WARNING):
        art, _ = convert(tmp_path, _conv_chain(), quant_config={"node_config": {"softmax": {"qtype": "int16"}}})
    placed = nodes(art)
    assert placed["softmax"].on == "BPU"                       # a per-node qtype forces Softmax onto the BPU
    assert placed["softmax"].output_dtype == "int8"
    assert placed["softmax"].qtype_note.startswith("op constraint: Softmax does not compute in int16")
    assert "quant_config: node softmax (Softmax) output int8 on BPU: op constraint" in caplog.text


def test_passive_op_qtype_does_not_take_effect_and_the_log_says_why(tmp_path, caplog):
    """qtype int16 on a Transpose alone: it takes its neighbours' threshold and type (passive quantization)."""
    with caplog.at_level(logging.WARNING):
        art, _ = convert(tmp_path, transpose_between_convs(), quant_config={"node_config": {"transpose": {"qtype": "int16"}}})
    placed = nodes(art)
    assert placed["transpose"].on == "BPU" and placed["transpose"].output_dtype == "int8"
    assert placed["transpose"].qtype_note.startswith("passive quantization")
    assert "node transpose (Transpose) output int8 on BPU: passive quantization" in caplog.text


def test_model_level_calibration_type_and_per_node_method(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        convert(tmp_path, _conv_chain(), calibration_type="default",
                quant_config={"model_config": {"activation": {"calibration_type": "max"}},
                              "node_config": {"conv_1": {"activation": {"calibration_type": "kl"}}}})
    assert "calibration method: max" in caplog.text
    assert "quant_config: node conv_1 calibrated with kl" in caplog.text


def test_float16_on_a_bpu_that_has_it_stays_on_the_bpu(tmp_path, caplog):
    """nash-p's BPU has float16: the node stays on the BPU and the table says float16 (bpuemu computes it
    with int16 quantization and logs so)."""
    with caplog.at_level(logging.INFO):
        art, _ = convert(tmp_path, _conv_chain(), march="nash-p", quant_config={"node_config": {"conv_1": {"qtype": "float16"}}})
    placed = nodes(art)
    assert placed["conv_1"].on == "BPU" and placed["conv_1"].output_dtype == "float16"
    assert placed["conv_1"].qtype_note == ""
    assert "float16 on nash-p's BPU is emulated with int16 quantization" in caplog.text and "conv_1" in caplog.text


def test_a_qtype_on_a_node_the_bpu_does_not_run_says_op_constraint(tmp_path, caplog):
    """int16 on a Where (not a BPU op) cannot take effect: the log names the node and the op's constraint."""
    m = model_of([helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv_1", pads=[1, 1, 1, 1]),
                  helper.make_node("Greater", ["c1", "zero"], ["keep"], name="greater"),
                  helper.make_node("Where", ["keep", "c1", "zero"], ["w"], name="where"),
                  helper.make_node("Conv", ["w", "w2"], ["y"], name="conv_2")],
                 {"x": [1, 3, 8, 8]}, ["y"], [weight("w1", (8, 3, 3, 3), 1), weight("w2", (4, 8, 1, 1), 2),
                                                 onnx.numpy_helper.from_array(np.array(0, np.float32), "zero")])
    with caplog.at_level(logging.WARNING):
        art, _ = convert(tmp_path, m, quant_config={"op_config": {"Where": {"qtype": "int16"}}})
    note = nodes(art)["where"].qtype_note
    assert note.startswith("op constraint: quant_config op_config qtype int16 does not take effect")
    assert "not supported by the BPU" in note
    assert "quant_config: node where (Where) output float32 on CPU: op constraint" in caplog.text
