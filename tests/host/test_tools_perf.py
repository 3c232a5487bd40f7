"""hb_perf on `.bin` files made by hb_mapper makertbin: the static estimate, the report, the browser, --compare."""
import json
import os
import re
import subprocess

import numpy as np
import onnx
import pytest
from onnx import shape_inference

from bpuemu.common.container import read_bin
from bpuemu.host.tools import pack
from bpuemu.host.tools import static_perf as perf
from bpuemu.host.cli import hb_perf as perf_cli
from bpuemu.host.tools.static_perf.structure import BPU_COLOUR, CPU_COLOUR
from bpuemu.host.compiler.timing.x5 import KINDS
import tools_models
from helpers.installed import chromium

DARK_CYAN = (0x00, 0x8B, 0x8B)
GREY = (0x80, 0x80, 0x80)
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"


@pytest.fixture(scope="module")
def bins(tmp_path_factory):
    return tools_models.build_all(str(tmp_path_factory.mktemp("perf_bins")))


run_tool = tools_models.run_tool


def pixels(path):
    from PIL import Image

    with Image.open(path) as img:
        img.load()
        return img.size, np.asarray(img.convert("RGB"))


def count_colour(rgb: np.ndarray, colour) -> int:
    return int(np.all(rgb == np.array(colour, np.uint8), axis=-1).sum())


# --- the folder, the numbers ---------------------------------------------------------------

def test_hb_perf_writes_the_seed_folder(bins, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_tool(perf_cli.main, [bins["fm"]], capsys)
    assert code == 0, err
    d = tmp_path / "hb_perf_result" / "fm"
    assert sorted(os.listdir(d)) == ["fm", "fm.html", "fm.png", "fm_subgraph_0.html", "fm_subgraph_0.json"]
    assert "WARNING" not in err                                # compiled with debug: True
    assert re.search(STAMP + r" INFO fm: FPS=\d+\.\d\d, latency = \d+\.\d us, DDR = \d+ bytes$", err, re.M)
    page = (d / "fm.html").read_text()
    for part in ("Model Performance Summary", "Details", "BIN Model Structure", "Model Latency(ms)",
                 "Total DDR (loaded+stored) bytes per frame(MB per frame)", "Loaded Bytes per Frame",
                 "Stored Bytes per Frame", "Model Subgraph Calculation Load (OPpf)",
                 "Model Subgraph DDR Occupation(Mbpf)", 'href="fm_subgraph_0.html"', 'src="fm.png"'):
        assert part in page
    dot = (d / "fm").read_text()
    m = read_bin(bins["fm"]).model()
    for step in m.plan:                                        # every profiler node is in the structure
        assert f'label="{step.name}\\n' in dot
    assert dot.count(f'fillcolor="{BPU_COLOUR}"') == 1
    assert dot.count(f'fillcolor="{CPU_COLOUR}"') == len(m.plan) - 1


def _expected_ops(float_model: onnx.ModelProto) -> dict:
    """OPs per node computed here from the float model's own shapes (independent of hb_perf's code)."""
    g = shape_inference.infer_shapes(float_model).graph
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in list(g.value_info) + list(g.input) + list(g.output)}
    weights = {t.name: list(t.dims) for t in g.initializer}
    ops = {}
    for n in g.node:
        out = shapes[n.output[0]]
        if n.op_type == "Conv":
            w = weights[n.input[1]]
            ops[n.name] = 2 * int(np.prod(out)) * w[1] * w[2] * w[3]
        elif n.op_type == "Gemm":
            w = weights[n.input[1]]
            ops[n.name] = 2 * out[0] * w[0] * w[1]
        elif n.op_type == "GlobalAveragePool":
            ops[n.name] = int(np.prod(shapes[n.input[0]]))
        elif n.op_type == "Flatten":
            ops[n.name] = 0
        else:
            ops[n.name] = int(np.prod(out))
    return ops


def test_layer_details_follow_the_static_model(bins, tmp_path, capsys, monkeypatch):
    from bpuemu.host.samples import sample_float_model

    monkeypatch.chdir(tmp_path)
    run_tool(perf_cli.main, [bins["fm"]], capsys)
    doc = json.loads((tmp_path / "hb_perf_result" / "fm" / "fm_subgraph_0.json").read_text())
    layers = {layer["name"]: layer for layer in doc["layer_details"]}
    expected = _expected_ops(sample_float_model(32, 32, image_input=False))
    bpu_nodes = {k: v for k, v in expected.items() if k != "Softmax_prob"}
    assert {k: layers[k]["ops"] for k in bpu_nodes} == bpu_nodes
    assert layers["Conv_0"]["bpu_type"] == "HzSQuantizedConv" and layers["Conv_0"]["unit"] == "mac"
    assert layers["Flatten_0"]["unit"] == "view" and layers["Flatten_0"]["latency_us"] == 0
    # channel padding: Cin 3 -> 8 for the first conv, a depthwise conv pays 8x (1 -> 8 input channels)
    assert layers["Conv_0"]["aligned_ops"] == layers["Conv_0"]["ops"] * 8 // 3
    assert layers["Conv_1_dw"]["aligned_ops"] == layers["Conv_1_dw"]["ops"] * 8
    assert layers["Conv_0_relu"]["fused_into"] == "Conv_0" and layers["Conv_0_relu"]["latency_us"] == 0
    bpu = perf.X5_BPU
    clock = 0.0
    for layer in doc["layer_details"]:
        if layer["kind"] in ("conv", "conv1x1", "matmul"):      # aligned MACs at the kind's rate, + the layer's fixed cost
            rate = bpu.rates()[KINDS.index(layer["kind"])]
            assert rate < 5000                                  # 10 TOPS at 1 GHz is the peak
            rate *= layer["pixels"] / (layer["pixels"] + bpu.mac_half_pixels)     # small feature maps fill it less
            assert layer["compute_us"] == pytest.approx(layer["aligned_ops"] / 2 / rate / 1000 + bpu.layer_overhead_us)
        ddr_us = (layer["loaded_bytes"] + layer["stored_bytes"]) / bpu.ddr_bytes_per_s * 1e6
        assert layer["load_store_us"] == pytest.approx(ddr_us)
        assert layer["latency_us"] == pytest.approx(max(layer["compute_us"], layer["load_store_us"]))
        assert layer["start_us"] == pytest.approx(clock)
        clock = layer["end_us"]
    s = doc["summary"]
    assert s["calculation_load_ops_per_frame"] == sum(v for v in bpu_nodes.values())
    assert s["latency_ms"] == pytest.approx((bpu.subgraph_overhead_us + clock) / 1e3)
    # the subgraph's input (int8 1x3x32x32) is loaded once; its int8 output (1x10) goes to the Softmax,
    # which the X5 runs in the same BPU graph: it stays on chip (estimate.on_chip_tensors)
    assert doc["inputs"][0]["bytes"] == 3 * 32 * 32 and doc["outputs"][0]["bytes"] == 10
    weights = sum(layer["weight_bytes"] for layer in doc["layer_details"])
    assert s["ddr_loaded_bytes_per_frame"] == 3 * 32 * 32 + weights and s["ddr_stored_bytes_per_frame"] == 0


def test_without_debug_hb_perf_prints_the_seed_warnings(bins, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_tool(perf_cli.main, [bins["cpu_middle"]], capsys)
    assert code == 0
    warnings = [line for line in err.splitlines() if " WARNING " in line]
    assert len(warnings) == 2
    assert re.fullmatch(STAMP + r" WARNING bpu model don't have per-layer perf info\.", warnings[0])
    assert re.fullmatch(STAMP + r" WARNING if you need per-layer perf info please enable"
                        r"\[compiler_parameters\.debug:True\] when use makertbin\.", warnings[1])
    d = tmp_path / "hb_perf_result" / "cpu_middle"
    for i in (0, 1):                                           # two BPU subgraphs around the CPU Softmax
        doc = json.loads((d / f"cpu_middle_subgraph_{i}.json").read_text())
        assert "layer_details" not in doc and doc["summary"]["subgraph"] == f"BPU_cpu_middle_subgraph_{i}"
        assert "don't have per-layer perf info" in (d / f"cpu_middle_subgraph_{i}.html").read_text()
    est = perf.estimate_model(read_bin(bins["cpu_middle"]).model(), read_bin(bins["cpu_middle"]).blobs)
    assert [s.name for s in est.subgraphs] == ["BPU_cpu_middle_subgraph_0", "BPU_cpu_middle_subgraph_1"]
    # the X5 runs the Softmax between them on its BPU too (bpuemu runs it on the CPU)
    assert est.latency_us == pytest.approx(sum(s.latency_us for s in est.subgraphs)
                                           + sum(s.latency_us for s in est.cpu_steps if s.on_bpu))
    assert "Softmax_mid" in [s.name for s in est.cpu_steps]


def test_structure_png_has_dark_cyan_bpu_and_grey_cpu_nodes(bins, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_tool(perf_cli.main, [bins["cpu_middle"]], capsys)
    (w, h), rgb = pixels(tmp_path / "hb_perf_result" / "cpu_middle" / "cpu_middle.png")
    assert w > 100 and h > 100
    cyan, grey = count_colour(rgb, DARK_CYAN), count_colour(rgb, GREY)
    assert cyan > 2000 and grey > 2000
    # two BPU subgraphs, eight CPU steps: the grey area is the larger
    assert grey > 2 * cyan


def test_estimate_line_and_the_ddr_bandwidth_parameter(bins):
    b = read_bin(bins["residual"])
    m = b.model()
    line = perf.estimate_line(m, b.blobs)
    match = re.fullmatch(r"FPS=(\d+\.\d\d), latency = (\d+\.\d) us, DDR = (\d+) bytes", line)
    assert match, line
    est = perf.estimate_model(m, b.blobs)
    assert float(match.group(2)) == pytest.approx(est.latency_us, abs=0.05)
    assert float(match.group(1)) == pytest.approx(1e6 / est.latency_us, abs=0.01)
    assert int(match.group(3)) == est.ddr_bytes > 0
    slow = perf.estimate_model(m, b.blobs, perf.X5_BPU.with_ddr_bandwidth(0.01))
    assert slow.ddr_bytes == est.ddr_bytes and slow.latency_us > 10 * est.latency_us   # memory bound now
    tiny_sram = perf.estimate_model(m, b.blobs, perf.X5_BPU.with_values(sram_bytes=256))
    assert tiny_sram.ddr_bytes > est.ddr_bytes                 # intermediates spill to DDR


def _with_compiler_flags(model, flags: str):
    from bpuemu.common.proto import model_pb2

    m = model_pb2.Model()
    m.CopyFrom(model)
    del m.build_info.compiler_parameters[:]
    m.build_info.compiler_parameters.add(key="hbdk_pass_through_params", value=flags)
    return m


def test_compile_mode_balance_factor_and_optimize_level_reach_the_estimate(bins):
    b = read_bin(bins["fm"])
    m = b.model()
    assert perf.strategy_of(m).compile_mode == "latency" and perf.strategy_of(m).optimize_level == "O3"

    def est(flags):
        return perf.estimate_model(_with_compiler_flags(m, flags), b.blobs)

    latency, bandwidth = est("--fast --O3"), est("--O3")
    assert (latency.strategy.compile_mode, bandwidth.strategy.compile_mode) == ("latency", "bandwidth")
    # bandwidth: the 1x10 float output of the Softmax (which the X5 runs in the BPU graph, the conv's output
    # kept on chip) stored packed (40 bytes, not the aligned 1x16's 64), and repacked by the move unit
    assert latency.stored_bytes == 64 and bandwidth.stored_bytes == 40
    assert bandwidth.ddr_bytes == latency.ddr_bytes - 24
    # the storing layer: less DDR time, more compute (40 bytes repacked by the move unit, 1 GHz)
    bw_last, lat_last = bandwidth.bpu_pieces[-1].layers[-1], latency.bpu_pieces[-1].layers[-1]
    assert bw_last.compute_us == pytest.approx(lat_last.compute_us + 40 / perf.X5_BPU.move_bytes_per_cycle / 1000)
    assert bw_last.load_store_us < lat_last.load_store_us
    assert bandwidth.latency_us != latency.latency_us
    # balance N: 0 is bandwidth, 100 latency, 50 half way
    assert est("--balance 0 --O3").summary() | {"compile_mode": "-", "balance_factor": 0} == \
        bandwidth.summary() | {"compile_mode": "-", "balance_factor": 0}
    assert est("--balance 100 --O3").latency_us == pytest.approx(latency.latency_us)
    half = est("--balance 50 --O3")
    assert half.stored_bytes == 52
    assert min(bandwidth.latency_us, latency.latency_us) < half.latency_us < max(bandwidth.latency_us, latency.latency_us)
    # optimize_level: O3 < O2 (half the SRAM) <= ... O1 (no overlap) < O0 (no fusion either)
    o = {lvl: est(f"--fast --{lvl}") for lvl in ("O0", "O1", "O2", "O3")}
    assert o["O0"].latency_us > o["O1"].latency_us > o["O2"].latency_us >= o["O3"].latency_us
    layers1 = o["O1"].subgraphs[0].layers
    assert all(layer.latency_us == pytest.approx(layer.compute_us + layer.load_store_us) for layer in layers1)
    assert not any(layer.fused_into for layer in o["O0"].subgraphs[0].layers)
    assert any(layer.fused_into for layer in layers1)
    # an SRAM exactly the size of the largest intermediate: it spills at O2 (half the SRAM), not at O3
    largest = max(int(np.prod(layer.output_shape)) for layer in o["O3"].subgraphs[0].layers[:-1])
    tiny = perf.X5_BPU.with_values(sram_bytes=largest)
    assert perf.estimate_model(_with_compiler_flags(m, "--fast --O2"), b.blobs, tiny).ddr_bytes > \
        perf.estimate_model(_with_compiler_flags(m, "--fast --O3"), b.blobs, tiny).ddr_bytes


def test_hb_perf_says_which_strategy_it_estimated(bins, tmp_path, capsys, monkeypatch):
    from bpuemu.common.container import write_bin

    monkeypatch.chdir(tmp_path)
    b = read_bin(bins["fm"])
    path = tmp_path / "fm.bin"
    write_bin(str(path), [_with_compiler_flags(b.model(), "--balance 40 --O1 --debug")], dict(b.blobs))
    code, _, err = run_tool(perf_cli.main, [path], capsys)
    assert code == 0, err
    assert "fm: compile_mode balance (balance_factor 40), optimize_level O1 (from the model's compiler parameters)" in err
    doc = json.loads((tmp_path / "hb_perf_result" / "fm" / "fm_subgraph_0.json").read_text())
    assert doc["compile_strategy"] == {"compile_mode": "balance", "balance_factor": 40, "optimize_level": "O1",
                                       "recorded": True}
    page = (tmp_path / "hb_perf_result" / "fm" / "fm.html").read_text()
    assert "balance (balance_factor 40)" in page and "<td>optimize_level</td><td>O1</td>" in page


def test_hb_perf_on_a_packed_file(bins, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    comb = tmp_path / "comb.bin"
    pack.pack_files([bins["fm"], bins["residual"]], str(comb))
    code, _, err = run_tool(perf_cli.main, ["-p", comb, "-m", "residual"], capsys)
    assert code == 0, err
    assert os.listdir(tmp_path / "hb_perf_result") == ["residual"]
    assert (tmp_path / "hb_perf_result" / "residual" / "residual_subgraph_0.json").exists()
    code, _, err = run_tool(perf_cli.main, [comb], capsys)     # all models; -p forgotten: a warning, not a failure
    assert code == 0
    assert "is a packed model; analysing it as with -p" in err
    assert sorted(os.listdir(tmp_path / "hb_perf_result")) == ["fm", "residual"]
    code, _, err = run_tool(perf_cli.main, ["-p", comb, "-m", "nope"], capsys)
    assert code != 0 and "model 'nope' is not in" in err


# --- the report in a real browser -----------------------------------------------------------

def _screenshot(url: str, png, profile) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--window-size=1200,1800",
         f"--screenshot={png}", url],
        capture_output=True, text=True, timeout=120)


def _js_errors(stderr: str):
    return [line for line in stderr.splitlines() if "Uncaught" in line or ":CONSOLE" in line and "rror" in line]


def test_report_renders_in_headless_chromium(bins, tmp_path, capsys, monkeypatch):
    # The JS-error check can fail: a page with a broken script is caught.
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>noSuchFunction();</script>x</body></html>")
    proc = _screenshot(bad.as_uri(), tmp_path / "bad.png", tmp_path / "profile_bad")
    assert _js_errors(proc.stderr), proc.stderr[-2000:]

    monkeypatch.chdir(tmp_path)
    run_tool(perf_cli.main, [bins["fm"]], capsys)
    d = tmp_path / "hb_perf_result" / "fm"
    for page, min_cyan in (("fm.html", 2000), ("fm_subgraph_0.html", 0)):
        shot = tmp_path / f"{page}.png"
        proc = _screenshot((d / page).as_uri(), shot, tmp_path / f"profile_{page}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert shot.is_file() and shot.stat().st_size > 0
        assert not _js_errors(proc.stderr), _js_errors(proc.stderr)
        (w, h), rgb = pixels(shot)
        assert (w, h) == (1200, 1800)
        assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 50          # text and tables, not a blank page
        assert (rgb < 100).all(axis=-1).sum() > 1000                     # dark text was drawn
        if min_cyan:  # the structure image loaded: its dark cyan BPU box (the legend swatch alone is 196 pixels)
            assert count_colour(rgb, DARK_CYAN) > min_cyan


# --- --compare with a real profiler.log ---------------------------------------------------

def _profile(model_file, directory):
    from click.testing import CliRunner
    from bpuemu.board.cli.hrt_model_exec import cli as hrt

    r = CliRunner().invoke(hrt, ["perf", "--model_file", str(model_file), "--frame_count", "20",
                                 "--profile_path", str(directory)])
    assert r.exit_code == 0, r.output
    return directory / "profiler.log"


def test_compare_joins_the_estimate_with_profiler_log(bins, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = _profile(bins["residual"], tmp_path / "prof")
    code, out, err = run_tool(perf_cli.main, [bins["residual"], "--compare", log], capsys)
    assert code == 0, err
    second = json.loads(log.read_text().split("\n***\n")[1])["model_latency"]
    b = read_bin(bins["residual"])
    est = perf.estimate_model(b.model(), b.blobs)
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line and not line.startswith("estimate:")}
    sub = rows["BPU_residual_subgraph_0"]
    assert sub[1] == "BPU"
    assert float(sub[2]) == pytest.approx(est.subgraphs[0].latency_us / 1e3, abs=1e-6)
    assert float(sub[3]) == pytest.approx(second["BPU_residual_subgraph_0"]["avg_time"], abs=1e-6)
    assert sub[6] == f"{second['BPU_residual_subgraph_0']['avg_time'] / (est.subgraphs[0].latency_us / 1e3):.2f}x"
    deq = rows["y_DequantizeLinear_HzDequantize"]
    deq_est = next(s for s in est.cpu_steps if s.name == "y_DequantizeLinear_HzDequantize").latency_us / 1e3
    assert deq[1] == "CPU" and float(deq[2]) == pytest.approx(deq_est, abs=1e-6) and float(deq[3]) == pytest.approx(second["y_DequantizeLinear_HzDequantize"]["avg_time"], abs=1e-6)
    assert "BPU" in rows and out.count("BPU total") == 1


def test_compare_refuses_a_log_of_another_model_or_garbage(bins, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = _profile(bins["fm"], tmp_path / "prof")
    code, _, err = run_tool(perf_cli.main, [bins["residual"], "--compare", log], capsys)
    assert code != 0
    assert err.splitlines()[0] == f"ERROR {log} was measured on model 'fm', the estimate is for 'residual'"
    junk = tmp_path / "junk.log"
    junk.write_text("hello\n")
    code, _, err = run_tool(perf_cli.main, [bins["residual"], "--compare", junk], capsys)
    assert code != 0 and "is not a profiler.log" in err and "Traceback" not in err
    code, _, err = run_tool(perf_cli.main, [bins["residual"], "--compare", tmp_path / "none.log"], capsys)
    assert code != 0 and "profiler log not found" in err
