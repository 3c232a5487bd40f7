"""What the X5 timing model represents physically where bpuemu's plan differs from the X5's compiled graph:
an elementwise chain of one int8 tensor (an exported GELU) is one lookup table, the tensors between the steps
of one BPU graph stay on chip, an nv12 input is converted on the BPU, attention's MatMul runs once per head."""
import numpy as np
import pytest
from onnx import helper, numpy_helper

from bpuemu.common import x5_timing
from bpuemu.common.container import read_bin
from bpuemu.common.proto import model_pb2
from bpuemu.host.compiler.timing.estimate import estimate_model
from bpuemu.host.compiler.timing.x5 import X5_BPU
import tools_models

GELU_NODES = ("gelu_div", "gelu_erf", "gelu_add", "gelu_mul", "gelu_half")


def gelu_model(seed=0):
    """conv -> GELU as torch exports it (x / sqrt 2, Erf, + 1, * x, * 0.5) -> conv."""
    rng, nodes, inits = np.random.default_rng(seed), [], []
    a = tools_models._conv("Conv_a", "x", 3, 16, 3, nodes, inits, rng, relu=False)
    for name, value in (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5)):
        inits.append(numpy_helper.from_array(np.array(value, np.float32), name))
    nodes += [helper.make_node("Div", [a, "sqrt2"], ["d"], name="gelu_div"),
              helper.make_node("Erf", ["d"], ["e"], name="gelu_erf"),
              helper.make_node("Add", ["e", "one"], ["p"], name="gelu_add"),
              helper.make_node("Mul", [a, "p"], ["m"], name="gelu_mul"),
              helper.make_node("Mul", ["m", "half"], ["g"], name="gelu_half")]
    tools_models._conv("Conv_b", "g", 16, 16, 3, nodes, inits, rng, relu=False, out="y")
    return tools_models._model("gelu", nodes, inits, {"x": [1, 3, 32, 32]}, {"y": [1, 16, 32, 32]})


def attention_model(seed=0):
    """conv -> q k^T over 4 heads (a MatMul of two activations) -> conv."""
    rng, nodes, inits = np.random.default_rng(seed), [], []
    a = tools_models._conv("Conv_a", "x", 3, 16, 3, nodes, inits, rng, relu=False)
    inits.append(numpy_helper.from_array(np.array([1, 4, 4, 64], np.int64), "heads"))
    nodes += [helper.make_node("Reshape", [a, "heads"], ["q"], name="split_heads"),
              helper.make_node("Transpose", ["q"], ["kt"], name="k_t", perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["kt", "q"], ["s"], name="attn_matmul")]
    tools_models._conv("Conv_b", "s", 4, 8, 1, nodes, inits, rng, relu=False, out="y")
    return tools_models._model("attention", nodes, inits, {"x": [1, 3, 8, 8]}, {"y": [1, 8, 64, 64]})


@pytest.fixture(scope="module")
def gelu(tmp_path_factory):
    path = tools_models.makertbin(str(tmp_path_factory.mktemp("gelu")), gelu_model(), "gelu")
    b = read_bin(path)
    return b.model(), estimate_model(b.model(), b.blobs)


def _layers(est):
    subs = list(est.subgraphs) + [s.layers for s in est.cpu_steps if s.layers is not None]
    return {layer.name: layer for sub in subs for layer in sub.layers}


def test_a_gelu_chain_is_one_lookup_table(gelu):
    model, est = gelu
    layers = _layers(est)
    assert set(GELU_NODES) <= set(layers), sorted(layers)
    chain = [layers[n] for n in GELU_NODES]
    tables = [x for x in chain if not x.fused_into]
    assert [x.name for x in tables] == ["gelu_half"] and tables[0].kind == "lut"
    assert all(x.fused_into == "lookup table" and x.compute_us == 0 for x in chain[:-1])
    # one table pass over the 16 x 32 x 32 output at the lookup rate, + one layer's fixed cost
    expected = 16 * 32 * 32 / X5_BPU.lut_elems_per_cycle / X5_BPU.clock_hz * 1e6 + X5_BPU.layer_overhead_us
    assert tables[0].compute_us == pytest.approx(expected)


def test_tensors_between_the_steps_of_one_bpu_graph_stay_on_chip(gelu):
    model, est = gelu
    kinds = {s.name: s.kind for s in model.plan}
    cpu_on_bpu = [s for s in est.cpu_steps if s.layers is not None]
    assert {kinds[s.name] for s in cpu_on_bpu} == {model_pb2.PlanStep.CPU_OP} and len(cpu_on_bpu) >= 2
    for step in cpu_on_bpu:     # GELU's Div and Erf: bpuemu runs them on its CPU, the X5 inside its BPU graph
        for layer in step.layers.layers:
            assert layer.loaded_bytes - layer.weight_bytes == 0 and layer.stored_bytes == 0, layer
    # one BPU graph on the X5: one subgraph overhead for the whole run
    overheads = [s.overhead_us for s in est.subgraphs] + [s.layers.overhead_us for s in cpu_on_bpu]
    assert sum(overheads) == pytest.approx(X5_BPU.subgraph_overhead_us)


def test_an_nv12_input_is_converted_on_the_bpu(tmp_path):
    path = tools_models.makertbin(str(tmp_path), tools_models.residual_model(), "res_nv12", input_type_rt="nv12")
    model = read_bin(path).model()
    pre = next(s for s in model.plan if s.kind == model_pb2.PlanStep.PREPROCESS)
    assert not pre.fused_into_subgraph                       # bpuemu's plan converts it in a step of its own
    assert x5_timing.on_bpu(pre) and pre.x5_on_bpu           # the X5 in its BPU graph
    assert pre.x5_us == pytest.approx(3 * 16 * 16 / X5_BPU.vector_elems_per_cycle / X5_BPU.clock_hz * 1e6)
    steps = x5_timing.plan_steps(model)
    assert [s.on_bpu for s in steps.steps if s.name == pre.name] == [True]


def test_attention_matmul_runs_once_per_head_at_the_conv_rate(tmp_path):
    path = tools_models.makertbin(str(tmp_path), attention_model(), "attention")
    b = read_bin(path)
    layer = _layers(estimate_model(b.model(), b.blobs))["attn_matmul"]
    assert layer.kind == "matmul" and layer.launches == 4 and layer.pixels == 64
    rate = X5_BPU.peak_macs_per_cycle * X5_BPU.conv1x1_efficiency * 64 / (64 + X5_BPU.mac_half_pixels)
    expected = layer.aligned_ops / 2 / rate / X5_BPU.clock_hz * 1e6 + 4 * (X5_BPU.layer_overhead_us + X5_BPU.matmul_head_us)
    assert layer.compute_us == pytest.approx(expected)


def se_model(seed=0):
    """conv -> squeeze-excitation (global pool, two 1x1 convs, HardSigmoid, the gate's broadcast Mul) -> conv."""
    rng, nodes, inits = np.random.default_rng(seed), [], []
    a = tools_models._conv("Conv_a", "x", 3, 16, 3, nodes, inits, rng)
    nodes.append(helper.make_node("GlobalAveragePool", [a], ["pooled"], name="se_pool"))
    r = tools_models._conv("se_reduce", "pooled", 16, 8, 1, nodes, inits, rng)
    e = tools_models._conv("se_expand", r, 8, 16, 1, nodes, inits, rng, relu=False)
    nodes += [helper.make_node("HardSigmoid", [e], ["gate"], name="se_gate"),
              helper.make_node("Mul", [a, "gate"], ["scaled"], name="se_scale")]
    tools_models._conv("Conv_b", "scaled", 16, 16, 3, nodes, inits, rng, relu=False, out="y")
    return tools_models._model("se", nodes, inits, {"x": [1, 3, 32, 32]}, {"y": [1, 16, 32, 32]})


def test_a_squeeze_excitation_gate_pays_the_barrier_once(tmp_path):
    path = tools_models.makertbin(str(tmp_path), se_model(), "se")
    b = read_bin(path)
    layers = _layers(estimate_model(b.model(), b.blobs))
    assert [name for name, layer in layers.items() if layer.barrier] == ["se_scale"]
    scale = layers["se_scale"]
    # the broadcast Mul: a vector pass over the 16 x 32 x 32 map, its fixed cost, and the gate's barrier
    expected = 16 * 32 * 32 / X5_BPU.vector_elems_per_cycle / X5_BPU.clock_hz * 1e6 + X5_BPU.layer_overhead_us \
        + X5_BPU.gate_barrier_us
    assert scale.kind == "vector" and scale.compute_us == pytest.approx(expected)
