"""The X5 timing model against published RDK X5 board figures, without torch (issue 16).

A few architectures of bench/x5_fit.csv, exported as bench/x5_export.py exports them and
committed with their weights zeroed (tests/data/x5/<model>.onnx.gz, written by
``bench/x5_timing.py --write-ci-graphs``: the timing model reads shapes, not values), are
converted as a user converts them (``hb_mapper makertbin --fast-perf``, or for nv12 rows the
same settings in a yaml with ``input_type_rt: nv12``). The modeled FPS at the published thread
count and the modeled 1-thread latency must lie within tests/data/x5/band.csv's band around
the published figures: a ratio modeled / published in [lo, hi]. A timing model that drifts
(a parameter halved, an op kind costed twice) leaves the band.
"""
import csv
import gzip
import os
import subprocess
import sys

import pytest

from bpuemu.host.mapper.makertbin import FAST_PERF_REMOVED_TYPES
from bpuemu.host.tools.static_perf import modeled_perf

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "x5")


def band_rows():
    with open(os.path.join(DATA, "band.csv"), newline="") as f:
        return list(csv.DictReader(f))


def modeled(bin_path: str, threads: int):
    """(FPS at ``threads`` threads, 1-thread latency in ms): what hrt_model_exec perf's X5 block shows."""
    d = modeled_perf(bin_path, threads)
    return d["fps"], d["latency_1thread_ms"]


def nv12_yaml(onnx_path: str, prefix: str, input_name: str, shape: str) -> str:
    return "\n".join([
        "model_parameters:", f"  onnx_model: '{onnx_path}'", "  march: bayes-e", f"  output_model_file_prefix: '{prefix}'",
        "  working_dir: model_output", f"  remove_node_type: '{';'.join(FAST_PERF_REMOVED_TYPES)}'",
        "input_parameters:", f"  input_name: '{input_name}'", f"  input_shape: {shape}", "  input_type_train: rgb",
        "  input_layout_train: NCHW", "  input_type_rt: nv12", "  norm_type: no_preprocess",
        "calibration_parameters:", "  calibration_type: skip", "  optimization: set_Softmax_input_int8",
        "compiler_parameters:", "  compile_mode: latency", "  optimize_level: O3", ""])


def convert(tmp_path, row) -> str:
    model = row["model"]
    onnx_path = tmp_path / f"{model}.onnx"
    with gzip.open(os.path.join(DATA, f"{model}.onnx.gz"), "rb") as f:
        onnx_path.write_bytes(f.read())
    h, w = row["input_hw"].split("x")
    shape = f"1x3x{h}x{w}"
    if row["input_type"] == "featuremap":
        args = ["--fast-perf", "--model", onnx_path.name, "--model-type", "onnx", "--march", "bayes-e",
                "-i", row["input_name"], shape]
    else:
        (tmp_path / "config.yaml").write_text(nv12_yaml(onnx_path.name, model, row["input_name"], shape))
        args = ["--config", "config.yaml", "--model-type", "onnx"]
    run = subprocess.run([sys.executable, "-m", "bpuemu.host.cli.hb_mapper", "makertbin", *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return str(tmp_path / "model_output" / f"{model}.bin")


def test_band_file_covers_the_committed_graphs():
    rows = band_rows()
    graphs = sorted(n[:-len(".onnx.gz")] for n in os.listdir(DATA) if n.endswith(".onnx.gz"))
    assert sorted(r["model"] for r in rows) == graphs
    assert sum(os.path.getsize(os.path.join(DATA, f"{g}.onnx.gz")) for g in graphs) < 400_000
    for r in rows:
        assert 0 < float(r["fps_lo"]) < float(r["fps_hi"]) and 0 < float(r["latency_lo"]) < float(r["latency_hi"])


@pytest.mark.parametrize("row", band_rows(), ids=lambda r: r["model"])
def test_modeled_x5_figures_lie_in_the_band(tmp_path, row):
    fps, latency_ms = modeled(convert(tmp_path, row), int(row["threads"]))
    fps_ratio = fps / float(row["published_fps"])
    lat_ratio = latency_ms / float(row["published_latency_ms"])
    seen = (f"{row['model']}: modeled {fps:.1f} FPS at {row['threads']} threads, {latency_ms:.2f} ms 1-thread; "
            f"published {row['published_fps']} FPS, {row['published_latency_ms']} ms; ratios FPS {fps_ratio:.3f}, "
            f"latency {lat_ratio:.3f}")
    assert float(row["fps_lo"]) <= fps_ratio <= float(row["fps_hi"]), seen
    assert float(row["latency_lo"]) <= lat_ratio <= float(row["latency_hi"]), seen
