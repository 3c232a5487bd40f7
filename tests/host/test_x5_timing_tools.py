"""The X5 timing model end to end: makertbin's estimate line == hb_perf == hrt_model_exec perf's X5 block,
the model's op-kind costs, and a .bin made before the model."""
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

from bpuemu.board.cli.hrt_model_exec import cli as hrt
from bpuemu.common import x5_timing
from bpuemu.common.container import read_bin
from bpuemu.host.cli import hb_perf as perf_cli
from bpuemu.host.tools import static_perf as perf
from bpuemu.host.compiler.timing.x5 import KINDS, PARAMETERS, X5_BPU
import tools_models

LINE = re.compile(r"FPS=\d+\.\d\d, latency = \d+\.\d us, DDR = \d+ bytes")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A model with BPU subgraphs around a CPU op and dequantized outputs, converted by makertbin in its own cwd;
    (bin path, makertbin's log text)."""
    import io
    import logging

    d = tmp_path_factory.mktemp("x5_e2e")
    text = io.StringIO()
    handler = logging.StreamHandler(text)
    logger = logging.getLogger("bpuemu.host")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        path = tools_models.makertbin(str(d / "m"), tools_models.cpu_middle_model(), "cpu_middle", debug=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return path, text.getvalue()


def test_makertbin_line_is_hb_perf_is_hrt_model_exec_x5_block(converted, tmp_path, capsys, monkeypatch):
    path, log = converted
    made = LINE.findall(log)
    assert len(made) == 1, log[-2000:]
    line = made[0]
    model = read_bin(path).model()
    assert x5_timing.has_timing(model) and x5_timing.estimate_line(model) == line   # what the .bin stores

    monkeypatch.chdir(tmp_path)
    code, _, err = tools_models.run_tool(perf_cli.main, [path], capsys)
    assert code == 0, err
    assert f"INFO cpu_middle: {line}" in err and "WARNING cpu_middle: the .bin stores" not in err
    page = (tmp_path / "hb_perf_result" / "cpu_middle" / "cpu_middle.html").read_text()
    latency_us = float(re.search(r"latency = (\d+\.\d) us", line).group(1))
    subs = [json.loads((tmp_path / "hb_perf_result" / "cpu_middle" / f"cpu_middle_subgraph_{i}.json").read_text())
            for i in (0, 1)]
    stored = {s.name: s.x5_us for s in model.plan}
    for doc in subs:   # per subgraph and per layer, the figures the .bin stores
        assert doc["summary"]["latency_ms"] * 1e3 == pytest.approx(stored[doc["summary"]["subgraph"]])
        assert {s["name"]: s["modeled_us"] for s in doc["plan_steps"]} == pytest.approx(stored)
        layers = doc["layer_details"]
        assert doc["summary"]["latency_ms"] * 1e3 == pytest.approx(
            doc["summary"]["launch_overhead_us"] + sum(layer["latency_us"] for layer in layers))
    bpu_total = sum(us for s, us in stored.items() if s.startswith("BPU_")) + \
        sum(s.x5_us for s in model.plan if x5_timing.on_bpu(s) and not s.name.startswith("BPU_"))
    assert latency_us == pytest.approx(bpu_total, abs=0.05)
    assert "X5 Timing Model" in page and "provenance" in page

    r = CliRunner().invoke(hrt, ["perf", "--model_file", path, "--thread_num", "2", "--frame_count", "30"])
    assert r.exit_code == 0, r.output
    assert f"compiler estimate (BPU only): {line}" in r.output
    assert "Host figures: measured on local runtime" in r.output
    r = CliRunner().invoke(hrt, ["perf", "--model_file", path, "--thread_num", "2", "--frame_count", "30", "--json"])
    x5 = json.loads(r.output)["x5"]
    assert x5["estimate_line"] == line and x5["thread_num"] == 2 and x5["frame_count"] == 30
    expected = x5_timing.schedule(x5_timing.plan_steps(model), 2, 30)
    assert x5["fps"] == pytest.approx(expected.fps) and x5["latency_ms"] == pytest.approx(expected.latency_ms)
    assert x5["steps_us"] == pytest.approx(stored)


def test_profiler_log_carries_each_steps_modeled_time(converted, tmp_path):
    path, _ = converted
    r = CliRunner().invoke(hrt, ["perf", "--model_file", path, "--frame_count", "5", "--profile_path", str(tmp_path)])
    assert r.exit_code == 0, r.output
    first, second = (json.loads(p) for p in (tmp_path / "profiler.log").read_text().split("\n***\n"))
    stored = {s.name: s.x5_us / 1e3 for s in read_bin(path).model().plan}
    latency = second["model_latency"]
    assert {n: v["x5_time"] for n, v in latency.items() if "x5_time" in v} == pytest.approx(stored)
    assert first["x5_model"]["thread_num"] == 1 and first["x5_model"]["frame_count"] == 5
    assert "x5_time_ms" in (tmp_path / "profiler.csv").read_text().splitlines()[0]


def test_a_bin_made_before_the_model_says_rebuild(tmp_path, capsys, monkeypatch):
    from bpuemu.common.container import write_bin
    from bpuemu.host.samples import sample_bin

    path = str(tmp_path / "new.bin")
    sample_bin(path, height=16, width=16)
    b = read_bin(path)
    model = b.model()
    model.ClearField("x5_timing")
    for s in model.plan:
        s.ClearField("x5_us")
    old = str(tmp_path / "old.bin")
    write_bin(old, [model], b.blobs)
    r = CliRunner().invoke(hrt, ["perf", "--model_file", old, "--frame_count", "3"])
    assert r.exit_code == 0, r.output
    assert "X5 model: no X5 timing in this model, rebuild with makertbin" in r.output.splitlines()
    r = CliRunner().invoke(hrt, ["perf", "--model_file", old, "--frame_count", "3", "--json"])
    assert json.loads(r.output)["x5"] == {"error": "no X5 timing in this model, rebuild with makertbin"}
    monkeypatch.chdir(tmp_path)
    code, _, err = tools_models.run_tool(perf_cli.main, [old], capsys)
    assert code == 0 and "no X5 timing in this model, rebuild with makertbin" in err
    # --timing x5 cannot pace a model it has no timing for: one ERROR line
    from bpuemu.board.cli.hrt_model_exec import main as hrt_main

    with pytest.raises(SystemExit) as exc:
        hrt_main(["infer", "--model_file", old, "--timing", "x5"])
    err = capsys.readouterr().err
    from bpuemu.board.runtime.model import set_timing

    set_timing("host")
    assert exc.value.code != 0 and "Traceback" not in err
    assert [ln for ln in err.splitlines() if ln.startswith("ERROR")] == \
        [f"ERROR model '{model.name}': no X5 timing in this model, rebuild with makertbin (this board runs --timing x5)"]


# --- the op-kind costs ----------------------------------------------------------------------

def _layer_us(kind: str, work: float, ddr: float = 0.0, pixels=None) -> float:
    _, _, cycles = X5_BPU.layer_cycles(KINDS.index(kind), work, 0.0, ddr, False, True, pixels)
    return float(X5_BPU.us(cycles))


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "view"])
def test_each_kinds_cost_grows_with_its_work_and_its_traffic(kind):
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    costs = [_layer_us(kind, w) for w in sizes]
    assert all(b > a for a, b in zip(costs, costs[1:]))
    assert costs[0] >= X5_BPU.layer_overhead_us               # a layer's fixed cost
    assert _layer_us(kind, 1e3, ddr=1e9) > _layer_us(kind, 1e3, ddr=1e6) > 0   # memory-bound when traffic dominates
    assert _layer_us("view", 1e6) == 0.0


def test_conv_costs_follow_channel_alignment_and_groups(tmp_path):
    """A 1x1 conv with 9 output channels pays for 16; a depthwise conv is costed by its own rate."""
    import onnx
    from onnx import helper, numpy_helper

    from bpuemu.host.compiler.timing.layers import subgraph_layers

    def conv_piece(cin, cout, k, group=1):
        w = numpy_helper.from_array(np.zeros((cout, cin // group, k, k), np.int8), "w")
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="c", kernel_shape=[k, k], group=group,
                                  pads=[k // 2] * 4)]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, cin, 32, 32])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, cout, 32, 32])], [w])
        return onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))

    def layer(cin, cout, k, group=1):
        return subgraph_layers(conv_piece(cin, cout, k, group), X5_BPU)[0]

    c8, c9, c16 = layer(16, 8, 1), layer(16, 9, 1), layer(16, 16, 1)
    assert (c8.kind, c9.kind) == ("conv1x1", "conv1x1")
    assert c9.work == c16.work == 2 * c8.work                  # 9 channels cost what 16 cost
    k3 = layer(16, 16, 3)
    assert k3.kind == "conv" and k3.work == 9 * c16.work
    g4 = layer(16, 16, 3, group=4)                            # grouped, 4 channels a group: dense per group
    assert g4.kind == "conv" and g4.work == 32 * 32 * 16 * 4 * 9 * 2   # 4 input channels a group pay for 8
    dw = layer(16, 16, 3, group=16)
    assert dw.kind == "dwconv" and dw.work == 32 * 32 * 16 * 9
    fill = 1024 / (1024 + X5_BPU.mac_half_pixels)              # a 32x32 output fills the MAC array this much
    assert dw.pixels == 1024
    assert dw.compute_us == pytest.approx(X5_BPU.layer_overhead_us + dw.work / (X5_BPU.dwconv_macs_per_cycle * fill) / 1e3)


def test_small_feature_maps_fill_the_mac_array_less():
    per_mac = [_layer_us("conv", 1e7, pixels=px) for px in (49, 196, 784, 3136, 12544)]
    assert all(b < a for a, b in zip(per_mac, per_mac[1:]))
    assert _layer_us("conv", 1e7, pixels=1e8) == pytest.approx(_layer_us("conv", 1e7), rel=1e-3)   # huge map: full rate


def test_every_parameter_says_where_it_comes_from():
    for name, p in PARAMETERS.items():
        assert p.provenance.split(" (")[0] in ("X5 published specification", "assumed", "fitted"), name
        assert p.value > 0 and p.unit and p.doc
    assert PARAMETERS["peak_macs_per_cycle"].value == 5000 and PARAMETERS["clock_hz"].value == 1e9


def test_modeled_perf_is_the_bench_entry(converted):
    path, _ = converted
    d = perf.modeled_perf(path, thread_num=4)
    model = read_bin(path).model()
    run = x5_timing.schedule(x5_timing.plan_steps(model), 4, 200)
    assert d["fps"] == pytest.approx(run.fps) and d["latency_1thread_ms"] == pytest.approx(run.latency_1thread_ms)
    assert x5_timing.estimate_line(model) == \
        f"FPS={d['estimate_fps']:.2f}, latency = {d['estimate_latency_us']:.1f} us, DDR = {d['ddr_bytes']} bytes"
