"""ptq_faq_j6 "Explanation on Support for int32 data types in Operator Constraints", its three cases, and
"Why some OPs supported by BPU at the tail part of the model running on CPU?", each from the FAQ's example."""
import numpy as np
import onnx

import pytest
from onnx import TensorProto, helper

from bpuemu.board.runtime import FOLLOW_MODEL, Runtime
from bpuemu.host.hb_onnxruntime import HB_ONNXRuntime

from j6_helpers import argmax, bin_devices, convert, ends_in_conv, int32_mul, model_of, nodes, weight


def _requantized(path: str, node: str) -> bool:
    """Whether the quantized model quantizes ``node``'s output (a QuantizeLinear reads it)."""
    g = onnx.load(path).graph
    out = next(n.output[0] for n in g.node if n.name == node)
    return any(n.op_type == "QuantizeLinear" and n.input[0] == out for n in g.node)


def _run_bin(path: str, feeds):
    rt = Runtime(march=FOLLOW_MODEL)   # the host simulator: each model on the march it was compiled for
    rt.load(path)
    return rt.model().run(feeds)


# --- case 1: the tail Conv outputs int32 (J6E/M) or float32 (J6B/H/P) -----------------------------

@pytest.mark.parametrize("march, dtype", [("nash-e", "int32"), ("nash-m", "int32"), ("nash-b", "float32"),
                                          ("nash-p", "float32")])
def test_a_model_ending_in_conv_outputs_the_marchs_high_accuracy_type(tmp_path, march, dtype):
    art, _ = convert(tmp_path, ends_in_conv(relu=False), march=march)
    placed = nodes(art)
    assert placed["conv_tail"].on == "BPU" and placed["conv_tail"].output_dtype == dtype
    assert placed["conv_1"].output_dtype == "int8"
    assert not _requantized(art.quantized, "conv_tail")        # the tail Conv's output is not requantized to int8
    assert _requantized(art.quantized, "relu_1")
    assert bin_devices(art.bin)["conv_tail"] == "BPU"
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = _run_bin(art.bin, {"x": x})[0]
    ref = HB_ONNXRuntime(art.quantized).run(None, {"x": x})[0]
    assert np.array_equal(got, ref)


def test_the_x5_keeps_the_tail_conv_int8_output(tmp_path):
    art, _ = convert(tmp_path, ends_in_conv(relu=False), march="bayes-e")
    assert _requantized(art.quantized, "conv_tail")
    assert nodes(art)["conv_tail"].output_dtype == ""          # the X5 flow resolves no output types


def test_conv_relu_at_the_tail_the_relu_runs_on_the_cpu(tmp_path):
    art, _ = convert(tmp_path, ends_in_conv(relu=True), march="nash-e")
    placed = nodes(art)
    assert placed["relu_tail"].on == "CPU" and placed["relu_tail"].reason.startswith("tail rule")
    assert placed["conv_tail"].output_dtype == "int32" and placed["relu_1"].on == "BPU"
    devices = bin_devices(art.bin)
    assert devices["relu_tail"] == "CPU" and devices["conv_tail"] == "BPU"


def test_quant_config_forces_the_tail_relu_onto_the_bpu_at_some_accuracy(tmp_path):
    """The FAQ: quant_config puts the tail ReLU on the BPU; the Conv then outputs int8 (fused with the
    ReLU), one BPU subgraph instead of a CPU op, and some accuracy is lost."""
    default, _ = convert(tmp_path, ends_in_conv(relu=True), march="nash-e", name="default")
    forced, _ = convert(tmp_path, ends_in_conv(relu=True), march="nash-e", name="forced",
                        quant_config={"node_config": {"relu_tail": {"qtype": "int8"}}})
    placed = nodes(forced)
    assert placed["relu_tail"].on == "BPU" and placed["relu_tail"].output_dtype == "int8"
    assert placed["conv_tail"].output_dtype == "int8" and not placed["conv_tail"].high_precision
    assert bin_devices(forced.bin)["relu_tail"] == "BPU"
    assert _requantized(forced.quantized, "conv_tail")
    assert forced.output_cosines["y"] <= default.output_cosines["y"]


def test_a_qtype_on_the_tail_relu_at_model_level_does_not_force_it_and_the_log_says_so(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO):   # a model-level default is logged at INFO, per node
        art, _ = convert(tmp_path, ends_in_conv(relu=True), march="nash-e",
                         quant_config={"model_config": {"all_node_type": "int16"}})
    assert nodes(art)["relu_tail"].on == "CPU"
    assert "node relu_tail (Relu) output float32 on CPU: tail rule: quant_config model_config qtype int16" in caplog.text


# --- case 2: an operator whose inputs are already int32 runs on the BPU unquantized ---------------

def test_a_mul_of_int32_inputs_runs_on_the_bpu_without_quantization(tmp_path):
    art, _ = convert(tmp_path, int32_mul(), march="nash-e")
    placed = nodes(art)
    assert placed["mul"].on == "BPU" and placed["mul"].output_dtype == "int32"
    q = onnx.load(art.quantized)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in q.graph.node)
    assert bin_devices(art.bin)["mul"] == "BPU"
    rng = np.random.default_rng(1)
    a, b = (rng.integers(-1000, 1000, (1, 4, 8, 8)).astype(np.int32) for _ in range(2))
    assert np.array_equal(_run_bin(art.bin, {"a": a, "b": b})[0], a * b)


# --- case 3: ArgMax needs a Cast to int8/int16/int32 to run on the BPU ------------------------------

def test_argmax_without_a_cast_runs_on_the_cpu(tmp_path):
    art, _ = convert(tmp_path, argmax(), march="nash-p")
    placed = nodes(art)
    assert placed["argmax"].on == "CPU" and "ArgMax outputs int64" in placed["argmax"].reason
    assert placed["argmax"].output_dtype == "int64"
    assert bin_devices(art.bin)["argmax"] == "CPU"


@pytest.mark.parametrize("to, dtype", [(TensorProto.INT8, "int8"), (TensorProto.INT16, "int16"),
                                       (TensorProto.INT32, "int32")])
def test_argmax_with_a_cast_runs_on_the_bpu(tmp_path, to, dtype):
    art, _ = convert(tmp_path, argmax(to), march="nash-p")
    placed = nodes(art)
    assert placed["argmax"].on == "BPU" and placed["cast"].on == "BPU"
    assert placed["cast"].output_dtype == dtype
    devices = bin_devices(art.bin)
    assert devices["argmax"] == "BPU" and devices["cast"] == "BPU"
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = _run_bin(art.bin, {"input": x})[0]
    assert got.dtype == np.dtype(dtype) and np.mean(got == np.argmax(x, axis=1)) > 0.9


def test_a_mul_of_int64_inputs_runs_on_the_cpu(tmp_path):
    """int64 (shape arithmetic) is not one of the BPU's integer types."""
    m = model_of([helper.make_node("Mul", ["a", "b"], ["y"], name="mul")], {"a": [1, 4], "b": [1, 4]},
                 ["y"], input_types={"a": TensorProto.INT64, "b": TensorProto.INT64})
    art, _ = convert(tmp_path, m, march="nash-e")
    assert nodes(art)["mul"].on == "CPU" and "int64" in nodes(art)["mul"].reason
    assert bin_devices(art.bin)["mul"] == "CPU"


def test_a_conv_followed_by_a_conv_transpose_is_not_the_tail_conv(tmp_path):
    """The tail Conv is the last quantized compute op: a ConvTranspose after it keeps the model on the BPU
    (PP-OCR det's head), and nothing outputs int32."""
    m = model_of([helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
                  helper.make_node("ConvTranspose", ["r1", "wt"], ["t"], name="deconv", strides=[2, 2], kernel_shape=[2, 2]),
                  helper.make_node("Sigmoid", ["t"], ["y"], name="sigmoid")],
                 {"x": [1, 3, 8, 8]}, ["y"], [weight("w1", (8, 3, 3, 3), 1), weight("wt", (8, 1, 2, 2), 2)])
    art, _ = convert(tmp_path, m, march="nash-e")
    placed = nodes(art)
    assert all(n.on == "BPU" for n in placed.values()) and not any(n.high_precision for n in placed.values())
