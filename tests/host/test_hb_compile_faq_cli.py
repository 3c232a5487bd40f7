"""ptq_faq_j6's precision answers through the `hb_compile` command, as a user meets them: a yaml naming a
quant_config JSON file, `hb_compile -c config.yaml`, then hb_compile.log (its node table: ON, Output Data
Type, Calibrated Cosine) and *_node_info.csv. The same behaviours at pipeline level are in
test_j6_faq_int32.py, test_j6_faq_nan.py, test_j6_faq_unitconv.py and test_j6_quant_config.py."""
import csv
import json
import math
import re
from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from bpuemu.common.container import read_bin
from bpuemu.common.march import march
from bpuemu.common.x5_timing import march_steps, plan_steps, schedule
from bpuemu.host.config.j6 import load_compile_config

from helpers.console import run
from j6_helpers import (argmax, cal_dir, conv_model, conv_reshape_concat, convert, ends_in_conv, int32_mul,
                        transpose_between_convs, where_neg_inf, write_yaml)


@dataclass
class Compiled:
    log: str
    table: Dict[str, Dict[str, str]]     # hb_compile.log's node table: node -> column -> cell
    csv: Dict[str, Dict[str, str]]       # *_node_info.csv, the same and its Note

    def on(self, node: str) -> str:
        return self.table[node]["ON"]

    def dtype(self, node: str) -> str:
        return self.table[node]["Output Data Type"]

    def output_cosine(self) -> float:
        return float(re.search(r"output \S+: cosine similarity ([0-9.]+)", self.log).group(1))

    def latency_us(self) -> float:
        """The estimate line's BPU latency: the march's modeled figure (the X5 model scaled per March.timing)."""
        return float(self.estimate().group(1))

    def latency_1thread_us(self) -> float:
        """The same line's 1-thread latency: the BPU time and the frame's CPU work."""
        return float(self.estimate().group(2))

    def estimate(self) -> "re.Match":
        return re.search(r"INFO FPS=[0-9.inf]+, latency = ([0-9.]+) us, DDR = \d+ bytes; "
                         r"1-thread latency = ([0-9.]+) us \(BPU [0-9.]+ us \+ CPU [0-9.]+ us\) \[(.*)\]$",
                         self.log, re.M)


def _log_table(log: str) -> Dict[str, Dict[str, str]]:
    lines = [ln.split(" INFO ", 1)[1] for ln in log.splitlines() if " INFO " in ln]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Node ") and "Output Data Type" in ln)
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = {}
    for ln in lines[start + 2:]:
        cells = re.split(r"\s{2,}", ln.strip())
        if len(cells) != len(header):
            break
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def hb_compile(tmp_path, model: onnx.ModelProto, march: str = "nash-e", quant_config=None, name: str = "m",
               calibration=None, cal_dtype=np.float32) -> Compiled:
    """``hb_compile -c config.yaml`` (the console script) in ``tmp_path/name``: the model, three
    calibration samples per input, the yaml, and ``quant_config.json`` when ``quant_config`` is given."""
    d = tmp_path / name
    d.mkdir()
    onnx.save(model, str(d / "m.onnx"))
    shapes = {i.name: [x.dim_value for x in i.type.tensor_type.shape.dim] for i in model.graph.input}
    dirs = cal_dir(str(d), shapes, dtype=cal_dtype)
    cal = dict(calibration or {})
    if quant_config is not None:
        (d / "quant_config.json").write_text(json.dumps(quant_config))
        cal["quant_config"] = "quant_config.json"
    write_yaml(str(d / "config.yaml"), "m.onnx", march, prefix="m",
               inputs={n: {"cal_data_dir": dirs[n]} for n in shapes}, calibration=cal)
    code, out = run("hb_compile", "-c", "config.yaml", cwd=str(d))
    assert code == 0, out[-2000:]
    log = (d / "hb_compile.log").read_text()
    with open(d / "model_output" / "m_node_info.csv") as f:
        table = {r["Node"]: r for r in csv.DictReader(f)}
    return Compiled(log, _log_table(log), table)


def _agree(c: Compiled) -> None:
    """The log's table and the csv show the same ON, Output Data Type and Calibrated Cosine."""
    for node, row in c.table.items():
        assert {k: c.csv[node][k] for k in row} == row


# --- one node table: the placement's output_dtype, the csv and the quantized model agree -------------

@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("model, march, config", [
    (lambda: ends_in_conv(relu=True), "nash-e", None),
    (lambda: ends_in_conv(relu=True), "nash-p", {"node_config": {"conv_1": {"qtype": "float16"}}}),
    (int32_mul, "nash-e", None),
    (lambda: argmax(TensorProto.INT16), "nash-p", None),
    (where_neg_inf, "nash-e", None),
    (conv_reshape_concat, "nash-b", {"node_config": {"concat": {"unitconv": "after"}}}),
], ids=["conv_relu", "float16", "int32_mul", "argmax_cast", "where", "unitconv"])
def test_output_data_type_is_the_placements_and_the_quantized_models(tmp_path, model, march, config):
    """The table's Output Data Type is NodePlacement.output_dtype, and the quantized model says the same
    but where the table shows what the board does: float16 (emulated with int16) and an ArgMax fused with
    its Cast (int64 in the model)."""
    from bpuemu.common.march import march as march_of
    from bpuemu.host.convert.nodetable import model_output_dtypes
    from bpuemu.host.compiler.placement import Placement

    art, _ = convert(tmp_path, model(), march=march, quant_config=config)
    table = {r["Node"]: r["Output Data Type"] for r in art.node_rows}
    assert table == {n.name: n.output_dtype for n in art.nodes}
    with open(art.node_info) as f:
        assert {r["Node"]: r["Output Data Type"] for r in csv.DictReader(f)} == table
    from_model = model_output_dtypes(Placement(art.nodes), onnx.load(art.quantized), march_of(march))
    explained = {("float16", "int16"), ("int16", "int64")}
    differ = {n: (table[n], from_model[n]) for n in table if table[n] != from_model[n]}
    assert set(differ.values()) <= explained, differ


# --- int32 case 1: the tail Conv; Conv+ReLU at the tail ---------------------------------------------

@pytest.mark.parametrize("march, dtype", [("nash-e", "int32"), ("nash-p", "float32")])
def test_a_model_ending_in_conv_shows_the_marchs_tail_type(tmp_path, march, dtype):
    c = hb_compile(tmp_path, ends_in_conv(relu=False), march)
    assert c.on("conv_tail") == "BPU" and c.dtype("conv_tail") == dtype
    assert c.dtype("conv_1") == "int8"
    _agree(c)


def test_conv_relu_at_the_tail_the_relu_is_on_the_cpu_and_quant_config_forces_it_onto_the_bpu(tmp_path):
    default = hb_compile(tmp_path, ends_in_conv(relu=True), name="default")
    assert default.on("relu_tail") == "CPU" and default.dtype("conv_tail") == "int32"
    assert "relu_tail (Relu) runs on CPU: tail rule: after the tail Conv conv_tail" in default.log
    assert default.csv["relu_tail"]["Note"].startswith("tail rule")

    forced = hb_compile(tmp_path, ends_in_conv(relu=True), name="forced",
                        quant_config={"node_config": {"relu_tail": {"qtype": "int8"}}})
    assert forced.on("relu_tail") == "BPU" and forced.dtype("relu_tail") == "int8"
    assert forced.dtype("conv_tail") == "int8"            # fused with the ReLU: no high-accuracy output
    assert forced.output_cosine() <= default.output_cosine()
    _agree(forced)


# --- int32 case 2 and case 3 -------------------------------------------------------------------------

def test_a_mul_of_int32_inputs_is_on_the_bpu_as_int32(tmp_path):
    c = hb_compile(tmp_path, int32_mul(), cal_dtype=np.int32)
    assert c.on("mul") == "BPU" and c.dtype("mul") == "int32"
    assert c.table["mul"]["Threshold"] == "--"              # not quantized


def test_argmax_is_on_the_cpu_without_a_cast_and_on_the_bpu_with_one(tmp_path):
    plain = hb_compile(tmp_path, argmax(), "nash-p", name="plain")
    assert plain.on("argmax") == "CPU" and plain.dtype("argmax") == "int64"
    assert "ArgMax outputs int64" in plain.csv["argmax"]["Note"]
    for to, dtype in ((TensorProto.INT8, "int8"), (TensorProto.INT16, "int16"), (TensorProto.INT32, "int32")):
        cast = hb_compile(tmp_path, argmax(to), "nash-p", name=f"cast_{dtype}")
        assert cast.on("argmax") == cast.on("cast") == "BPU", dtype
        assert cast.dtype("argmax") == cast.dtype("cast") == dtype


# --- Calibrated Cosine nan -------------------------------------------------------------------------

def test_calibrated_cosine_nan_is_named_in_the_log_with_the_reason(tmp_path):
    c = hb_compile(tmp_path, where_neg_inf())
    why = "its input neg_inf is -Inf (a Where whose second input is -Inf)"
    assert c.table["where"]["Calibrated Cosine"] == "nan"
    assert c.on("greater") == "CPU" and c.dtype("greater") == "bool"   # a CPU node shows its tensor's own type
    assert re.search(r"WARNING Calibrated Cosine of node where \(Where\) is nan: .*" + re.escape(why), c.log)
    assert why in c.csv["where"]["Note"]
    assert math.isfinite(c.output_cosine())                  # the conversion completed
    _agree(c)


# --- unitconv ----------------------------------------------------------------------------------------

def test_a_unitconv_moves_the_tail_onto_the_bpu_trading_cosine_for_time(tmp_path):
    """The FAQ's trade, as the log shows it: the tail leaves the CPU for the BPU, the output cosine does not rise,
    and the unitconv's own work shows in the march's modeled BPU time. (The X5 model prices the CPU Reshape and
    Concat it removes at almost nothing, so the modeled frame is no faster: the log lets the user judge.)"""
    default = hb_compile(tmp_path, conv_reshape_concat(32), name="default")
    unitconv = hb_compile(tmp_path, conv_reshape_concat(32), name="unitconv",
                          quant_config={"node_config": {"concat": {"unitconv": "after"}}})
    assert [default.on(n) for n in ("reshape_a", "reshape_b", "concat")] == ["CPU"] * 3
    assert [unitconv.on(n) for n in ("reshape_a", "reshape_b", "concat", "concat_unitconv")] == ["BPU"] * 4
    assert default.dtype("conv_a") == "int32" and unitconv.dtype("conv_a") == "int8"
    assert unitconv.output_cosine() <= default.output_cosine()
    # the march's modeled figures in the log's estimate line: the BPU does the unitconv's work too
    assert unitconv.latency_us() > default.latency_us()
    assert unitconv.latency_1thread_us() > 0 and default.latency_1thread_us() > 0


def test_the_logs_estimate_is_the_marchs_modeled_figure_with_its_label(tmp_path):
    """hb_compile.log's estimate line on a J6 march: the X5 timing model stored in the .hbm, scaled per
    March.timing as the board scales it (bpuemu.common.x5_timing.march_steps), with March.timing.label."""
    c = hb_compile(tmp_path, conv_reshape_concat(32), march="nash-b")
    model = read_bin(str(tmp_path / "m" / "model_output" / "m.hbm")).model()
    t = march("nash-b").timing
    assert c.estimate().group(3) == f"nash-b (J6B) {t.label}"
    x5_us = plan_steps(model).bpu_us
    assert c.latency_us() == pytest.approx(x5_us / t.bpu_speed_vs_x5, abs=0.06)
    assert c.latency_1thread_us() == pytest.approx(schedule(march_steps(model), 1, 1).latency_1thread_ms * 1e3, abs=0.06)
    assert f"latency = {x5_us:.1f} us" not in c.log          # the X5's own figure is not the one printed


# --- quant_config qtype is set but does not take effect ---------------------------------------------

@pytest.mark.parametrize("model, config, node, reason", [
    (transpose_between_convs, {"node_config": {"transpose": {"qtype": "int16"}}}, "transpose (Transpose)",
     "passive quantization"),
    (lambda: ends_in_conv(relu=True), {"node_config": {"conv_tail": {"qtype": "int16"}}}, "conv_tail (Conv)",
     "tail rule"),
    (where_neg_inf, {"node_config": {"greater": {"qtype": "int16"}}}, "greater (Greater)", "op constraint"),
], ids=["passive", "tail", "constraint"])
def test_a_qtype_that_does_not_take_effect_is_named_with_the_faqs_reason(tmp_path, model, config, node, reason):
    c = hb_compile(tmp_path, model(), quant_config=config)
    name = node.split()[0]
    assert re.search(rf"WARNING quant_config: node {re.escape(node)} output \S+ on (BPU|CPU): {reason}", c.log)
    assert c.csv[name]["Note"].startswith(reason)
    assert c.dtype(name) != "int16"


# --- the calibration method: quant_config's wins over the yaml's (legacy) ---------------------------

def test_quant_configs_calibration_type_wins_over_the_yamls_with_one_log_line(tmp_path):
    c = hb_compile(tmp_path, ends_in_conv(relu=False), calibration={"calibration_type": "kl"},
                   quant_config={"model_config": {"activation": {"calibration_type": "max"}}})
    lines = [ln for ln in c.log.splitlines() if "INFO calibration_type " in ln]
    assert len(lines) == 1 and lines[0].endswith(
        "calibration_type max: from quant_config model_config.activation.calibration_type, which wins; "
        "calibration_parameters.calibration_type kl is legacy on J6 and is not used")
    assert "calibration method: max" in c.log and "calibration method: kl" not in c.log


def test_the_yamls_calibration_type_is_used_when_quant_config_sets_none(tmp_path):
    c = hb_compile(tmp_path, ends_in_conv(relu=False), calibration={"calibration_type": "kl"},
                   quant_config={"node_config": {"conv_1": {"qtype": "int16"}}})
    assert "calibration_type kl: from calibration_parameters.calibration_type (legacy on J6" in c.log
    assert "calibration method: kl" in c.log


def test_quant_configs_skip_is_what_the_yamls_checks_read(tmp_path):
    """calibration_type skip in quant_config: the yaml needs no cal_data_dir (its check reads the winner)."""
    conv_model(str(tmp_path / "m.onnx"))
    write_yaml(str(tmp_path / "config.yaml"), "m.onnx",
               calibration={"quant_config": {"model_config": {"activation": {"calibration_type": "skip"}}}})
    ccfg = load_compile_config(tmp_path / "config.yaml")
    assert ccfg.config.calibration.calibration_type == "skip"
    assert ccfg.calibration_line.startswith("calibration_type skip: from quant_config model_config.activation")
