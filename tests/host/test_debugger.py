"""The accuracy debug tool (hmct-debugger, horizon_nn.quantizer.debugger) on a real makertbin conversion.

The model (tests/host/debugger_models.py) has two featuremap inputs and the
output shape DESIGN.md warns about: box coordinates in pixels concatenated with
0-1 scores. makertbin converts it with debug_mode: dump_calibration_data; the
debugger reads exactly what makertbin wrote.
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest

import horizon_nn.quantizer.debugger as dbg
from bpuemu.host.cli.hmct_debugger import parse_list
from bpuemu.host.quant.graph import prepare_model
from bpuemu.host.quant.joins import check_joins

import debugger_models as dm
from helpers.installed import chromium

INT16 = {"Concat_det": {"InputType": "int16", "OutputType": "int16"}}


@pytest.fixture(scope="module")
def det(tmp_path_factory):
    d = tmp_path_factory.mktemp("det")
    art = dm.convert(str(d / "base"), dm.detector_model(), "det")
    out = os.path.dirname(art.calibrated)
    return {"art": art, "model": art.calibrated, "data": os.path.join(out, "calibration_data"), "dir": d}


def _scripts_dir():
    return os.path.dirname(sys.executable)


def hmct(*args, cwd=None):
    exe = os.path.join(_scripts_dir(), "hmct-debugger")
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=240, cwd=cwd)


def test_list_syntax_as_the_seed_writes_it():
    assert parse_list("['Conv_2','Conv_90']") == ["Conv_2", "Conv_90"]
    assert parse_list("[Conv_2,Conv_90]") == ["Conv_2", "Conv_90"]          # the shell ate the quotes
    assert parse_list("[['Conv_2'],['Conv_2','Conv_90']]") == [["Conv_2"], ["Conv_2", "Conv_90"]]
    assert parse_list("[[Conv_2],[Conv_2, Conv_90]]") == [["Conv_2"], ["Conv_2", "Conv_90"]]
    assert parse_list("cosine-similarity") == ["cosine-similarity"]
    assert parse_list("a.1/x,b:0") == ["a.1/x", "b:0"]
    import click

    for bad in ("['a'", "['a']]", "[a,,b]"):
        with pytest.raises(click.BadParameter):
            parse_list(bad)


def test_calibration_data_is_what_makertbin_dumped(det):
    cm = dbg.load_model(det["model"])
    data = dbg.load_data(det["data"], cm)
    assert sorted(os.listdir(det["data"])) == ["a", "b"] and len(data) == 8
    assert set(data[0]) == {"a", "b"} and data[0]["a"].shape == (1, 3, dm.SIZE, dm.SIZE)
    assert {c.kind for c in cm.calibrations.values()} == {"weight", "activation"}


def test_sensitivity_tables_and_return_values(det, capsys):
    res = dbg.get_sensitivity_of_nodes(model_or_file=det["model"], metrics=["cosine-similarity", "mse"],
                                       calibrated_data=det["data"], output_node=None, node_type="node",
                                       data_num=None, verbose=True, interested_nodes=None)
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"=+node sensitivity=+", out[0])
    assert out[1].split() == ["node", "cosine-similarity", "mse"] and set(out[2]) == {"-"}
    cos = [v["cosine-similarity"] for v in res.values()]
    assert cos == sorted(cos) and len(cos) >= 6                        # most sensitive first
    assert list(res) == [line.split()[0] for line in out[3:]]
    assert all(round(v, 5) == v for vals in res.values() for v in vals.values())
    # Only the Concat's inputs quantized: the shared int8 scale destroys the scores part. The Concat is
    # passive, so its inputs' output calibrations (Mul_pixels_out, Sigmoid_score_out) carry that scale.
    assert res["Concat_det"]["cosine-similarity"] < 1.0

    w = dbg.get_sensitivity_of_nodes(det["model"], "mse", det["data"], node_type="weight", data_num=2, verbose=True)
    head = capsys.readouterr().out.splitlines()[1].split()
    assert head == ["weight", "node", "mse"] and all(k.endswith("_HzCalibration") for k in w)
    mses = [v["mse"] for v in w.values()]
    assert mses == sorted(mses, reverse=True)                          # largest error first
    a = dbg.get_sensitivity_of_nodes(det["model"], ["sqnr", "mre", "chebyshev"], det["data"], node_type="activation",
                                     verbose=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["activation", "node", "threshold", "bit", "sqnr", "mre", "chebyshev"]
    assert all(line.split()[3] == "8" for line in lines[3:])
    assert len(a) == len([c for c in dbg.load_model(det["model"]).calibrations.values() if c.kind == "activation"])
    # output_node and interested_nodes
    one = dbg.get_sensitivity_of_nodes(det["model"], calibrated_data=det["data"], output_node="Conv_box",
                                       interested_nodes=["Conv_box", "Conv_trunk"])
    assert set(one) == {"Conv_box", "Conv_trunk"}


def test_sensitivity_by_the_callers_own_metric(det):
    """A Metric(name, fn, higher_is_better) of the caller's: what the model is for, not one cosine over the
    output. Here the detector's scores (the last 2 of each row): only the Concat's shared int8 scale, which
    pixel boxes set, ruins them, and the scores' largest error puts it first; the same function as a built-in
    gives the built-in's figures; a function that is not a Metric is one clear error."""
    from bpuemu.common.compare import mse
    from bpuemu.common.errors import InvalidInput

    scores_err = dbg.Metric("scores-max-error", lambda ref, got: float(np.abs(ref[..., 4:] - got[..., 4:]).max()),
                            higher_is_better=False)
    res = dbg.get_sensitivity_of_nodes(det["model"], [scores_err, "cosine-similarity"], det["data"], data_num=4)
    first = next(iter(res))
    assert first == "Concat_det" and res[first]["scores-max-error"] > 0.05, res
    errs = [v["scores-max-error"] for v in res.values()]
    assert errs == sorted(errs, reverse=True)
    assert min(errs) < 0.02                                  # the nodes that do not touch the scores
    mine = dbg.get_sensitivity_of_nodes(det["model"], dbg.Metric("my-mse", mse, False), det["data"], data_num=2)
    builtin = dbg.get_sensitivity_of_nodes(det["model"], "mse", det["data"], data_num=2)
    assert {k: v["my-mse"] for k, v in mine.items()} == {k: v["mse"] for k, v in builtin.items()}
    with pytest.raises(InvalidInput, match="Metric\\(name, fn, higher_is_better\\)"):
        dbg.get_sensitivity_of_nodes(det["model"], [mse], det["data"], data_num=2)


def test_plots_from_the_seed_examples(det, tmp_path):
    d = str(tmp_path)
    flat = dbg.plot_acc_error(save_dir=d, calibrated_data=det["data"], model_or_file=det["model"],
                              quantize_node=["Conv_trunk", "Conv_score"], metric="cosine-similarity", average_mode=False)
    assert list(flat) == ["Conv_trunk", "Conv_score"] and os.path.getsize(os.path.join(d, "acc_error.png")) > 10000
    nested = dbg.plot_acc_error(save_dir=d, calibrated_data=det["data"], model_or_file=det["model"],
                                non_quantize_node=[["Conv_trunk"], ["Conv_trunk", "Concat_det"]], average_mode=True)
    assert list(nested) == ["partial_qmodel_0", "partial_qmodel_1"]
    wa = dbg.plot_acc_error(d, det["data"], det["model"], quantize_node=["weight", "activation"])
    raw = list(wa["activation"].values())
    avg = dbg.plot_acc_error(d, det["data"], det["model"], quantize_node=["activation"], average_mode=True)["activation"]
    assert list(avg.values()) == pytest.approx(np.cumsum(raw) / np.arange(1, len(raw) + 1))
    nodes = list(wa["weight"])
    assert nodes.index("Conv_trunk") < nodes.index("Concat_det")       # topological order

    cm = dbg.load_model(det["model"])
    act = next(c.name for c in cm.calibrations.values() if c.kind == "activation" and c.node == "Conv_trunk2")
    wgt = next(c.name for c in cm.calibrations.values() if c.kind == "weight")
    paths = dbg.plot_distribution(save_dir=d, model_or_file=det["model"], calibrated_data=det["data"],
                                  nodes_list=[act, wgt, "Conv_trunk"])
    assert len(paths) == 3 and all(os.path.getsize(p) > 10000 for p in paths.values())
    boxes = dbg.get_channelwise_data_distribution(save_dir=d, model_or_file=det["model"], calibrated_data=det["data"],
                                                  nodes_list=[act, wgt], axis=None)
    assert all(os.path.isfile(p) for p in boxes.values())

    sa = dbg.sensitivity_analysis(model_or_file=det["model"], calibrated_data=det["data"], pick_threshold=0.99999,
                                  data_num=1, sensitive_nodes=[], save_dir=d)
    assert sa["single"] and os.path.isfile(os.path.join(d, "sensitivity_analysis.png"))
    picked = list(sa["single"])
    # Keeping every picked node float can only bring the model closer to float on this model.
    assert sa["cumulative"][picked[-1]] >= sa["cumulative"]["none"]


def test_makertbin_warns_and_int16_restores_the_collapsed_part(det, tmp_path, caplog):
    art = det["art"]
    optimized = prepare_model(onnx.load(art.optimized))
    feeds = [{n: f[n] for n in "ab"} for f in dm.featuremaps(6, seed=99)]      # held out
    before = check_joins(optimized, onnx.load(art.quantized), feeds)
    assert len(before) == 1 and before[0].collapsed and before[0].node == "Concat_det"
    scores_before = before[0].parts[1]
    assert scores_before.distinct <= 2 and scores_before.cosine < 0.5
    assert art.output_cosines["detections"] > 0.999                    # the whole output looks fine

    import logging

    with caplog.at_level(logging.INFO, logger="bpuemu.host.makertbin"):
        fixed = dm.convert(str(tmp_path / "int16"), dm.detector_model(), "det", node_info=INT16)
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING and "joins parts" in r.message]
    assert not warnings, warnings
    after = check_joins(prepare_model(onnx.load(fixed.optimized)), onnx.load(fixed.quantized), feeds)
    scores_after = after[0].parts[1]
    print(f"scores part: cosine {scores_before.cosine:.4f} -> {scores_after.cosine:.4f}, "
          f"distinct values {scores_before.distinct} -> {scores_after.distinct}")
    assert after[0].dtype == "int16" and scores_after.cosine > 0.999 and scores_after.distinct > 30
    # The other remedy: the Concat and the shape ops after it on the CPU (the warning names all three).
    cpu = dm.convert(str(tmp_path / "cpu"), dm.detector_model(), "det",
                     node_info={n: {"ON": "CPU"} for n in before[0].chain})
    on_cpu = check_joins(prepare_model(onnx.load(cpu.optimized)), onnx.load(cpu.quantized), feeds)[0]
    print(f"on the CPU: scores part cosine {on_cpu.parts[1].cosine:.4f}, {on_cpu.parts[1].distinct} distinct values")
    assert before[0].chain == ["Concat_det", "Reshape_det", "Transpose_det"]
    assert on_cpu.dtype is None and not on_cpu.collapsed and on_cpu.parts[1].cosine > 0.999


def test_warning_names_node_ranges_and_remedy(det):
    art = det["art"]
    f = check_joins(prepare_model(onnx.load(art.optimized)), onnx.load(art.quantized), dm.featuremaps(2, seed=5))[0]
    w = f.warning()
    assert re.search(r"ranges differ 6\d\dx \(Mul_pixels_out \+-6\d\d(\.\d+)?, Sigmoid_score_out \+-0\.99", w), w
    for text in ("Concat_det", "'OutputType': 'int16'",
                 "run_on_cpu: 'Concat_det; Reshape_det; Transpose_det'", "set_model_output_int16"):
        assert text in w, (text, w)


def test_hb_mapper_makertbin_logs_the_mixed_range_warning(tmp_path):
    """What a user sees: the WARNING on the console and in hb_mapper_makertbin.log, once, naming the Concat,
    its parts' ranges and the remedy."""
    config = dm.write_project(str(tmp_path / "project"), dm.detector_model(), "det")
    proc = subprocess.run([os.path.join(_scripts_dir(), "hb_mapper"), "makertbin", "--config", config,
                           "--model-type", "onnx"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warning = re.compile(r"^\S+ \S+ WARNING output detections: Concat_det joins parts whose ranges differ \d+x "
                         r"\(Mul_pixels_out \+-6\d\d(\.\d+)?, Sigmoid_score_out \+-0\.99\d*\) under one int8 scale; "
                         r"part Sigmoid_score_out keeps \d distinct value\(s\), .* Remedy: .*run_on_cpu: "
                         r"'Concat_det; Reshape_det; Transpose_det'.*set_model_output_int16$")
    for where, text in (("console", proc.stdout + proc.stderr),
                        ("hb_mapper_makertbin.log", (tmp_path / "hb_mapper_makertbin.log").read_text())):
        lines = [line for line in text.splitlines() if "joins parts" in line]
        assert len(lines) == 1 and warning.match(lines[0]), (where, lines or text[-3000:])


def _check_page(index: str, tmp_path, extra: str = "") -> str:
    """index.html plus a script that records, after load, whether each image decoded."""
    page = os.path.join(os.path.dirname(index), "_images_check.html")
    script = ("<script>window.addEventListener('load', () => { const imgs = [...document.images];"
              "document.body.setAttribute('data-images', imgs.length + ':' + imgs.filter(i => i.complete && "
              "i.naturalWidth > 0).length); });</script>")
    with open(index) as f:
        html = f.read()
    with open(page, "w") as f:
        f.write(html.replace("</body>", extra + script + "</body>"))
    proc = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=10000",
                           "--allow-file-access-from-files", "--dump-dom", "file://" + page],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_runall_cli_writes_every_table_and_plot_and_the_page_loads(det, tmp_path):
    save = tmp_path / "runall"
    run = hmct("runall", det["model"], det["data"], "-s", save, "-dn", "4")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert "WARNING output detections: Concat_det joins parts" in run.stderr
    files = set(os.listdir(save))
    assert {"index.html", "summary.txt", "node_sensitivity.txt", "weight_sensitivity.txt", "activation_sensitivity.txt",
            "acc_error_weight_activation.png", "output_parts.txt"} <= files
    pngs = sorted(f for f in files if f.endswith(".png"))
    assert any(f.startswith("distribution_") for f in pngs) and any(f.startswith("channelwise_") for f in pngs)
    summary = (save / "summary.txt").read_text()
    assert summary.startswith("1. output detections: Concat_det joins parts"), summary   # ranked first
    html = (save / "index.html").read_text()
    assert all(f"src='{p}'" in html for p in pngs) and "node sensitivity" in html
    dom = _check_page(str(save / "index.html"), tmp_path)
    m = re.search(r'data-images="(\d+):(\d+)"', dom)
    assert m, dom[-2000:]
    assert int(m.group(1)) == len(pngs) and m.group(2) == m.group(1), m.group(0)
    # The check sees a broken image.
    broken = _check_page(str(save / "index.html"), tmp_path, "<img src='no_such_plot.png'>")
    assert f'data-images="{len(pngs) + 1}:{len(pngs)}"' in broken


def test_cli_subcommands_with_seed_flags(det, tmp_path):
    run = hmct("get-sensitivity-of-nodes", det["model"], det["data"], "-m", "['cosine-similarity','mse']", "-v", "True",
               "-d", "2")
    assert run.returncode == 0, run.stderr
    assert re.search(r"^node\s+cosine-similarity\s+mse$", run.stdout, re.M)
    run = hmct("plot_acc_error", det["model"], det["data"], "-q", "[Conv_trunk,Conv_score]", "-s", tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "acc_error.png").is_file() and "Conv_score: cosine-similarity at the last node" in run.stdout
    run = hmct("plot-acc-error", det["model"], det["data"], "-nq", "[['Conv_trunk'],['Conv_trunk','Conv_score']]",
               "-a", "True", "-s", tmp_path)
    assert run.returncode == 0 and "partial_qmodel_1" in run.stdout, run.stderr


@pytest.mark.parametrize("args, message", [
    (["get-sensitivity-of-nodes", "{optimized}", "{data}"], "is not a calibrated model: it has no HzCalibration nodes"),
    (["get-sensitivity-of-nodes", "{model}", "{wrong}"], "does not match the model's inputs: no folder for 'b'"),
    (["plot-acc-error", "{model}", "{data}", "-q", "[Conv_trunk,Conv_nope]"], "quantize_node 'Conv_nope' is not a node"),
    (["get-sensitivity-of-nodes", "{model}", "{data}", "-m", "cosine"], "unknown metric 'cosine'"),
    (["get-sensitivity-of-nodes", "{model}", "{data}", "-d", "99"], "data_num 99 is out of range"),
    (["plot-acc-error", "{model}", "{data}"], "give quantize_node or non_quantize_node"),
])
def test_bad_input_is_one_clear_line(det, tmp_path, args, message):
    wrong = tmp_path / "wrong"
    shutil.copytree(os.path.join(det["data"], "a"), wrong / "a")
    subs = {"optimized": det["art"].optimized, "model": det["model"], "data": det["data"], "wrong": wrong}
    run = hmct(*[a.format(**subs) for a in args], cwd=tmp_path)
    assert run.returncode != 0
    assert message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1, run.stderr


def test_blank_samples_are_counted_and_masked_per_output():
    from types import SimpleNamespace

    from bpuemu.host.debugger.runall import blank_samples

    ref = [[np.full((1, 4), v, np.float32)] for v in (0.9, 1e-7, 0.5, 0.0)]
    assert blank_samples(SimpleNamespace(tensors=["prob"], reference=ref)) == {"prob": 2}
    assert blank_samples(SimpleNamespace(tensors=["prob"], reference=ref[:1] + ref[2:3])) == {}
    from bpuemu.host.debugger.runall import blank_mask

    assert blank_mask(SimpleNamespace(tensors=["prob"], reference=ref)) == [False, True, False, True]
