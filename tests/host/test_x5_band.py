"""The X5 timing model against published RDK X5 board figures, without torch (issues 16, 31).

A few architectures of bench/x5_fit.csv, exported as bench/x5_export.py exports them and
committed with their weights zeroed (tests/data/x5/<model>.onnx.gz, written by
``bench/x5_timing.py --write-ci-graphs``: the timing model reads shapes, not values), are
converted as a user converts them (``hb_mapper makertbin --fast-perf``, or for nv12 rows the
same settings in a yaml with ``input_type_rt: nv12``, as the published .bins take).

The band is anchored on the board: the modeled FPS at the published thread count and the
modeled 1-thread latency must lie within tests/data/x5/band.csv's ``fps_band`` /
``latency_band`` of the published figures (|modeled / published - 1| <= band), the published
figures being bench/x5_fit.csv's. A model that drifts towards the board passes; one that drifts
away fails when it leaves the band; the bands are tightened as the model improves.

The drift check (``test_drift_check_...``) is separate and named as such: it pins each ratio to
within 2 % of the one recorded in band.csv when the timing model last changed on purpose, so that
an unintended change shows; a deliberate change of the model re-records them.
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


#: The drift check's tolerance around the recorded ratios.
DRIFT = 0.02
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")


def _published():
    out = {}
    for name in ("x5_fit.csv", "x5_check.csv"):
        with open(os.path.join(BENCH, name), newline="") as f:
            out.update({r["model"]: r for r in csv.DictReader(f)})
    return out


def _row_id(row) -> str:
    return row["model"] + ("" if row["input_type"] == "featuremap" else f"-{row['input_type']}")


def test_band_file_covers_the_committed_graphs():
    rows = band_rows()
    graphs = sorted(n[:-len(".onnx.gz")] for n in os.listdir(DATA) if n.endswith(".onnx.gz"))
    assert sorted({r["model"] for r in rows}) == graphs
    assert len({_row_id(r) for r in rows}) == len(rows)
    assert {r["input_type"] for r in rows} == {"featuremap", "nv12"}
    assert sum(os.path.getsize(os.path.join(DATA, f"{g}.onnx.gz")) for g in graphs) < 400_000
    published = _published()
    for r in rows:
        assert 0 < float(r["fps_band"]) <= 0.5 and 0 < float(r["latency_band"]) <= 0.5
        # anchored on the board: the published figures of the bench's csv, at its thread count
        pub = published[r["model"]]
        assert float(r["published_fps"]) == float(pub["x5_fps"])
        assert float(r["published_latency_ms"]) == float(pub["x5_latency_1thread_ms"])
        assert int(r["threads"]) == int(pub["threads"].split("(")[0])


_MODELED = {}


@pytest.fixture
def modeled_row(tmp_path_factory):
    def get(row):
        key = _row_id(row)
        if key not in _MODELED:
            path = convert(tmp_path_factory.mktemp(key), row)
            fps, latency_ms = modeled(path, int(row["threads"]))
            _MODELED[key] = (fps, latency_ms, fps / float(row["published_fps"]),
                             latency_ms / float(row["published_latency_ms"]))
        return _MODELED[key]
    return get


def _seen(row, fps, latency_ms, fps_ratio, lat_ratio) -> str:
    return (f"{_row_id(row)}: modeled {fps:.1f} FPS at {row['threads']} threads, {latency_ms:.2f} ms 1-thread; "
            f"published {row['published_fps']} FPS, {row['published_latency_ms']} ms; ratios FPS {fps_ratio:.3f}, "
            f"latency {lat_ratio:.3f}")


@pytest.mark.parametrize("row", band_rows(), ids=_row_id)
def test_modeled_x5_figures_lie_within_the_band_of_the_published(modeled_row, row):
    fps, latency_ms, fps_ratio, lat_ratio = modeled_row(row)
    seen = _seen(row, fps, latency_ms, fps_ratio, lat_ratio)
    assert abs(fps_ratio - 1) <= float(row["fps_band"]), seen
    assert abs(lat_ratio - 1) <= float(row["latency_band"]), seen


@pytest.mark.parametrize("row", band_rows(), ids=_row_id)
def test_drift_check_modeled_ratios_are_the_recorded_ones(modeled_row, row):
    fps, latency_ms, fps_ratio, lat_ratio = modeled_row(row)
    seen = _seen(row, fps, latency_ms, fps_ratio, lat_ratio) + " (re-record band.csv's ratios after a deliberate change)"
    assert fps_ratio == pytest.approx(float(row["recorded_fps_ratio"]), rel=DRIFT), seen
    assert lat_ratio == pytest.approx(float(row["recorded_latency_ratio"]), rel=DRIFT), seen
