"""hb_perf's output folder: ``hb_perf_result/<model>/``.

    <model>.html                 Model Performance Summary, Details per BPU subgraph,
                                 BIN Model Structure (the seed's three parts), and
                                 the static model's parameters
    <model>.png                  the BIN model structure
    <model>                      the same structure as Graphviz DOT text
    <model>_subgraph_<i>.html    one page per BPU subgraph (Layer Details with debug)
    <model>_subgraph_<i>.json    the same, for scripts

The pages are plain static HTML with inline CSS and no scripts.
"""
import html
import json
import os
from dataclasses import dataclass
from typing import List

from bpuemu.common import x5_timing
from bpuemu.common.march import March
from bpuemu.common.march import march as march_of
from bpuemu.host.compiler.timing.estimate import MB, ModelEstimate, SubgraphEstimate
from bpuemu.host.tools.static_perf.structure import BPU_COLOUR, CPU_COLOUR, Structure, dot, draw_png

_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #bbb; padding: 4px 10px; text-align: left; font-size: 13px; }
th { background: #eef3f3; } td.num { text-align: right; font-family: monospace; }
.legend span { display: inline-block; width: 14px; height: 14px; vertical-align: middle; margin: 0 6px 0 14px; }
.note { color: #555; font-size: 13px; } img { border: 1px solid #ccc; max-width: 100%; }
"""


@dataclass
class ReportFiles:
    directory: str
    html: str
    png: str
    dot: str
    subgraph_html: List[str]
    subgraph_json: List[str]
    estimate: ModelEstimate


def _e(text) -> str:
    return html.escape(str(text))


def _page(title: str, body: List[str]) -> str:
    return "\n".join(["<!DOCTYPE html>", "<html lang=\"en\">", "<head>", "<meta charset=\"utf-8\">",
                      f"<title>{_e(title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>", *body,
                      "</body>", "</html>"]) + "\n"


def _table(headers: List[str], rows: List[List[object]], numeric: bool = True) -> List[str]:
    out = ["<table>", "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr>"]
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            raw = isinstance(v, _Raw)
            cls = ' class="num"' if numeric and i > 0 and not raw and isinstance(v, (int, float)) else ""
            cells.append(f"<td{cls}>{v.text if raw else _e(_fmt(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return out


class _Raw:
    def __init__(self, text: str):
        self.text = text


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:.1f}"
    if isinstance(v, (list, tuple)):
        return "x".join(str(d) for d in v)
    return str(v)


def _parameters(est: ModelEstimate) -> List[str]:
    st = est.strategy
    rows = [["compile_mode", st.compile_mode + (f" (balance_factor {st.balance_factor})" if st.compile_mode == "balance" else ""),
             "", "the model's compiler parameters", ""],
            ["optimize_level", st.optimize_level + ("" if st.recorded else " (assumed: the model records none)"),
             "", "the model's compiler parameters", ""]]
    rows += [[name, value, unit, prov, doc] for name, value, unit, prov, doc in est.bpu.table()]
    return (["<h2>X5 Timing Model</h2>",
             "<p class=\"note\">bpuemu's X5 timing model (bpuemu.host.compiler.timing.x5 has every formula): per "
             "BPU layer, latency = max(compute, DDR traffic) with compute = work / the rate of the layer's kind "
             "(convolution by kernel and groups with channels aligned, matmul, vector, lookup table, data movement) "
             "+ a fixed cost per layer; a subgraph adds its overhead; the input conversion, CPU operators and "
             "_HzDequantize outputs are costed on the board's A55 cores. The fitted parameters come from "
             "bench/x5_fit.py on published RDK X5 measurements. makertbin stores each step's time in the .bin; "
             "hrt_model_exec perf shows the X5 figures for its --thread_num.</p>"]
            + _table(["parameter", "value", "unit", "provenance", "meaning"], rows, numeric=False))


@dataclass(frozen=True)
class _Board:
    """The board the report's figures model: the X5, or a J6 march (the X5 model scaled per March.timing)."""

    march: March
    steps: x5_timing.ModelSteps

    @classmethod
    def of(cls, est: ModelEstimate, march_name: str) -> "_Board":
        return cls(march_of(march_name or None), x5_timing.steps_on_march(est.model_steps(), march_name))

    @property
    def title(self) -> str:
        return f"{self.march.name} ({self.march.platform})" if self.march.is_j6 else "the X5"

    def bpu_us(self, x5_us: float) -> float:
        return x5_timing.step_us_on_march(x5_us, True, self.march.name)

    def note(self) -> List[str]:
        if not self.march.is_j6:
            return []
        return [f"<p class=\"note\">Figures on {_e(self.title)}: {_e(self.march.timing.label)}. The X5 timing "
                f"model below is what they are scaled from.</p>"]


def _plan_steps(est: ModelEstimate, board: "_Board") -> List[str]:
    one = x5_timing.schedule(board.steps, 1, 1)
    rows = [[s.name, "BPU" if s.on_bpu else "CPU", round(s.us, 3)] for s in board.steps.steps]
    rows.append(["task overhead (per frame)", "CPU", round(board.steps.task_overhead_us, 3)])
    return ([f"<h2>Plan Steps on {_e(board.title)}</h2>", *board.note(),
             f"<p class=\"note\">One frame with one thread: {one.latency_1thread_ms:.6f} ms (BPU {one.bpu_ms:.6f} ms, "
             f"CPU {one.cpu_ms:.6f} ms); with several threads the BPU steps serialize and the CPU steps overlap "
             f"(hrt_model_exec perf --thread_num N shows the modeled figures).</p>"]
            + _table(["step", "on", "modeled time (us)"], rows))


def model_page(est: ModelEstimate, png_name: str, debug: bool, march_name: str = "") -> str:
    """The model's page; on a J6 march (``march_name``) its timing figures are the march's, labelled."""
    board = _Board.of(est, march_name)
    bpu_us = board.steps.bpu_us
    fps = f"{1e6 / bpu_us:.2f}" if bpu_us > 0 else "n/a"
    summary = [
        ["Model Name", est.model_name],
        ["Model Latency(ms)", round(bpu_us / 1e3, 6)],
        ["Model FPS (BPU busy all the time)", _Raw(_e(fps))],
        ["Task Latency, 1 thread (ms)", round(x5_timing.schedule(board.steps, 1, 1).latency_1thread_ms, 6)],
        ["Total DDR (loaded+stored) bytes per frame(MB per frame)", round(est.ddr_bytes / MB, 6)],
        ["Loaded Bytes per Frame", est.loaded_bytes],
        ["Stored Bytes per Frame", est.stored_bytes],
    ]
    if board.march.is_j6:
        summary.append(["Modeled board", f"{board.title}: {board.march.timing.label}"])
    details = [[_Raw(f"<a href=\"{_e(s.file_stem)}.html\">{_e(s.name)}</a>"), s.ops, round(s.ddr_bytes / MB, 6),
                round(board.bpu_us(s.latency_us) / 1e3, 6)] for s in est.subgraphs]
    body = [f"<h1>hb_perf: {_e(est.model_name)}</h1>", "<h2>Model Performance Summary</h2>", *board.note()]
    body += _table(["Item", "Value"], summary)
    body += ["<h2>Details</h2>"]
    if details:
        body += _table(["Model Subgraph Name", "Model Subgraph Calculation Load (OPpf)",
                        "Model Subgraph DDR Occupation(Mbpf)", "Model Subgraph Latency(ms)"], details)
    else:
        body.append("<p class=\"note\">This model has no BPU subgraph.</p>")
    if not debug:
        body.append("<p class=\"note\">bpu model don't have per-layer perf info; compile with "
                    "compiler_parameters.debug: True for Layer Details.</p>")
    body += ["<h2>BIN Model Structure</h2>",
             f"<p class=\"legend\"><span style=\"background:{BPU_COLOUR}\"></span>BPU"
             f"<span style=\"background:{CPU_COLOUR}\"></span>CPU</p>",
             f"<img src=\"{_e(png_name)}\" alt=\"BIN model structure of {_e(est.model_name)}\">"]
    body += _plan_steps(est, board)
    body += _parameters(est)
    return _page(f"{est.model_name} performance", body)


def subgraph_json(est: ModelEstimate, sub: SubgraphEstimate, debug: bool) -> dict:
    doc = {"model": est.model_name, "summary": sub.summary(), "inputs": sub.inputs, "outputs": sub.outputs,
           "static_model": est.bpu.parameters(),
           "plan_steps": [{"name": n, "on": "BPU" if b else "CPU", "modeled_us": us} for n, b, us in est.plan],
           "compile_strategy": {"compile_mode": est.strategy.compile_mode, "balance_factor": est.strategy.balance_factor,
                                "optimize_level": est.strategy.optimize_level, "recorded": est.strategy.recorded}}
    if debug:
        doc["layer_details"] = [layer.as_dict() for layer in sub.layers]
    return doc


def subgraph_page(est: ModelEstimate, sub: SubgraphEstimate, debug: bool) -> str:
    s = sub.summary()
    body = [f"<h1>{_e(sub.name)}</h1>", f"<p><a href=\"{_e(est.model_name)}.html\">back to {_e(est.model_name)}</a></p>",
            "<h2>Subgraph Summary</h2>"]
    body += _table(["Item", "Value"], [
        ["Model Subgraph Name", sub.name],
        ["Model Subgraph Calculation Load (OPpf)", sub.ops],
        ["Loaded Bytes per Frame", sub.loaded_bytes],
        ["Stored Bytes per Frame", sub.stored_bytes],
        ["Model Subgraph DDR Occupation(Mbpf)", round(s["ddr_occupation_mb_per_frame"], 6)],
        ["Model Subgraph Latency(ms)", round(s["latency_ms"], 6)],
        ["launch overhead (us)", round(sub.overhead_us, 3)],
    ])
    body.append("<h2>Inputs and Outputs</h2>")
    body += _table(["direction", "tensor", "shape", "dtype", "bytes"],
                   [["input", t["name"], t["shape"], t["dtype"], t["bytes"]] for t in sub.inputs]
                   + [["output", t["name"], t["shape"], t["dtype"], t["bytes"]] for t in sub.outputs], numeric=False)
    body.append("<h2>Layer Details</h2>")
    if debug:
        rows = [[layer.name + (f" (fused into {layer.fused_into})" if layer.fused_into else ""), layer.bpu_type,
                 layer.ops, layer.output_shape, layer.aligned_output_shape, round(layer.compute_us, 4),
                 round(layer.load_store_us, 4), f"{layer.start_us:.3f} - {layer.end_us:.3f} us"]
                for layer in sub.layers]
        body += _table(["layer", "type", "ops", "original output shape", "aligned output shape",
                        "computing cost (no DDR) (us)", "load/store cost (us)", "active period of time"], rows)
    else:
        body.append("<p class=\"note\">bpu model don't have per-layer perf info. If you need per-layer perf info "
                    "please enable [compiler_parameters.debug:True] when use makertbin.</p>")
    return _page(sub.name, body)


def write_report(est: ModelEstimate, struct: Structure, out_dir: str, debug: bool, march_name: str = "") -> ReportFiles:
    """Write every file of ``hb_perf_result/<model>/`` into ``out_dir`` (the model page's timing on ``march_name``)."""
    os.makedirs(out_dir, exist_ok=True)
    name = est.model_name
    png = os.path.join(out_dir, f"{name}.png")
    draw_png(struct, png, title=f"BIN Model Structure: {name}")
    dot_path = os.path.join(out_dir, name)
    with open(dot_path, "w") as f:  # out_dir is a staging directory (analyze): no partial file is ever published
        f.write(dot(struct, name))
    sub_html, sub_json = [], []
    for sub in est.subgraphs:
        h = os.path.join(out_dir, f"{sub.file_stem}.html")
        with open(h, "w") as f:
            f.write(subgraph_page(est, sub, debug))
        j = os.path.join(out_dir, f"{sub.file_stem}.json")
        with open(j, "w") as f:
            json.dump(subgraph_json(est, sub, debug), f, indent=2)
            f.write("\n")
        sub_html.append(h)
        sub_json.append(j)
    main = os.path.join(out_dir, f"{name}.html")
    with open(main, "w") as f:
        f.write(model_page(est, f"{name}.png", debug, march_name))
    return ReportFiles(out_dir, main, png, dot_path, sub_html, sub_json, est)
