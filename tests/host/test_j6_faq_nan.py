"""ptq_faq_j6 "In the conversion process, what are the several scenarios in which the Calibrated Cosine
column appears as nan": each case from the FAQ's structure; the conversion names the node, says why
(``cosine_note``, the log) and completes."""
import logging
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from j6_helpers import convert, model_of, nodes, scalar, weight, where_neg_inf


def _concat_of_zeros():
    """Case 2.1: a Concat whose two inputs are all-0 constants, then a Slice: one branch is all 0."""
    zeros = [numpy_helper.from_array(np.zeros((1, 4, 8, 8), np.float32), n) for n in ("z1", "z2")]
    ints = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("st", 4), ("en", 8), ("ax", 1))]
    return model_of([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                     helper.make_node("Concat", ["z1", "z2"], ["cat"], name="concat", axis=1),
                     helper.make_node("Slice", ["cat", "st", "en", "ax"], ["s"], name="slice"),
                     helper.make_node("Add", ["c", "s"], ["a"], name="add"),
                     helper.make_node("Conv", ["a", "w2"], ["y"], name="conv_out")],
                    {"x": [1, 3, 8, 8]}, ["y"], [weight("w", (4, 3, 3, 3)), weight("w2", (4, 4, 1, 1), 3)] + zeros + ints)


def _cast_equal():
    """Case 2.2: a bool tensor onnx::Not_3, Cast + Equal false everywhere, Cast(bool -> float32): all 0.

    The FAQ's bool tensor is a model input; the `.bin` has no bool input type, so here a Greater on a
    featuremap input makes it."""
    return model_of([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                     helper.make_node("Greater", ["m", "zero"], ["onnx::Not_3"], name="greater"),
                     helper.make_node("Cast", ["onnx::Not_3"], ["mf"], name="cast_in", to=TensorProto.FLOAT),
                     helper.make_node("Equal", ["mf", "two"], ["eq"], name="equal"),
                     helper.make_node("Cast", ["eq"], ["ef"], name="cast_out", to=TensorProto.FLOAT),
                     helper.make_node("Mul", ["c", "ef"], ["mm"], name="mul"),
                     helper.make_node("Conv", ["mm", "w2"], ["y"], name="conv_out")],
                    {"x": [1, 3, 8, 8], "m": [1, 1, 8, 8]}, ["y"],
                    [weight("w", (4, 3, 3, 3)), weight("w2", (4, 4, 1, 1), 3), scalar("two", 2.0), scalar("zero", 0.0)])


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("build, node, words", [
    (where_neg_inf, "where", "its input neg_inf is -Inf (a Where whose second input is -Inf)"),
    (_concat_of_zeros, "add", "its input s is all zeros on every calibration sample (a Concat of all-0 constants (concat)"),
    (_cast_equal, "mul", "its input ef is all zeros on every calibration sample (a Cast of the Equal equal"),
])
def test_calibrated_cosine_nan_names_the_node_and_why(tmp_path, caplog, build, node, words):
    with caplog.at_level(logging.WARNING):
        art, _ = convert(tmp_path, build(), march="nash-e")
    assert math.isnan(art.cosines[node])
    assert words in nodes(art)[node].cosine_note
    assert f"Calibrated Cosine of node {node} " in caplog.text and words in caplog.text
    assert all(math.isfinite(c) for c in art.output_cosines.values())      # the conversion completed
    others = [n.name for n in art.nodes if n.name != node and n.cosine_note == "" and n.name in art.cosines]
    assert others and all(not math.isnan(art.cosines[n]) for n in others)


def test_the_x5_table_keeps_its_cosines(tmp_path):
    """The X5 flow is unchanged: an all-zero input does not turn its reader's cosine into nan."""
    art, _ = convert(tmp_path, _concat_of_zeros(), march="bayes-e")
    assert not math.isnan(art.cosines["add"]) and nodes(art)["add"].cosine_note == ""


def test_the_node_table_reads_thresholds_beside_the_notes(tmp_path):
    art, _ = convert(tmp_path, _cast_equal(), march="nash-e")
    assert art.thresholds["conv"] > 0 and set(art.thresholds) <= set(art.cosines) | {n.name for n in art.nodes}
