"""runall: the seed's whole debugging workflow in one call, written to one folder with an index page.

Steps (defaults as in the seed's "runall Workflow"):

1-2. weight and activation calibration node sensitivity (and ordinary node
     sensitivity, which steps 3 and 6 use), on ``data_num`` samples;
3.   distributions of the top 5 weight and top 5 activation calibration nodes
     (and of the top 5 ordinary nodes when node_type is 'node'), or of ``dis_nodes_list``;
4.   channel-wise box plots of those calibration nodes, or of ``cw_nodes_list``;
5.   cumulative error curves quantizing only weights / only activations, or
     ``quantize_node`` / ``non_quantize_node``;
6.   sensitivity analysis of the nodes below ``pick_threshold`` (at most
     ``MAX_ANALYSED`` of them), or of ``sensitive_nodes``;
7.   every model output fed by a Concat, part by part (bpuemu.host.quant.joins):
     one cosine over a whole output can hide a collapsed part.

Then a summary of what to try, most promising first, in ``summary.txt`` and
``index.html`` (every table and figure on one page).
"""
import html
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from bpuemu.common.compare import METRICS
from bpuemu.host.debugger import acc_error, analysis, distribution
from bpuemu.host.debugger.data import CalibratedModel, load_data, load_model
from bpuemu.host.debugger.engine import Evaluator, all_but, resolve_metrics
from bpuemu.host.debugger.sensitivity import candidates_for, output_tensors, rank, sensitivity_table
from bpuemu.host.quant.joins import JoinFinding, check_joins

TOP = 5
MAX_ANALYSED = 10
#: Sensitive nodes whose "kept float" effect runall checks (one run of the samples each).
MAX_CHECKED = 20
ACTIVE_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
DEFAULT_DIR = "./debug_result"


@dataclass
class RunallResult:
    save_dir: str
    sensitivity: Dict[str, Dict[str, Dict[str, float]]] = field(default_factory=dict)   # kind -> table
    tables: Dict[str, str] = field(default_factory=dict)                                # title -> text
    figures: Dict[str, str] = field(default_factory=dict)                               # caption -> PNG path
    acc_error: Dict[str, Dict[str, float]] = field(default_factory=dict)
    analysis: Dict[str, Dict[str, float]] = field(default_factory=dict)
    joins: List[JoinFinding] = field(default_factory=list)
    #: node -> output cosine of the calibrated model with that node's remedy simulated (``remedy_gains``)
    float_one: Dict[str, float] = field(default_factory=dict)
    remedy: Dict[str, str] = field(default_factory=dict)
    quantized_cosine: float = 0.0
    blank: Dict[str, int] = field(default_factory=dict)     # output -> samples with a nearly all-zero float output
    samples: int = 0
    advice: List[str] = field(default_factory=list)
    seconds: float = 0.0


def tail_nodes(cm: CalibratedModel) -> set:
    """Ordinary nodes with no active (Conv/Gemm/MatMul) node after them: the run_on_cpu candidates."""
    calib_out = {c.input: c.output for c in cm.calibrations.values()}
    tails = set()
    for n in reversed(cm.ordinary):
        nexts = []
        for o in n.output:
            for t in (o, calib_out.get(o)):
                nexts += cm.readers(t) if t else []
        if all(cm.by_name[m].op_type not in ACTIVE_OPS and m in tails for m in nexts):
            tails.add(n.name)
    return tails


def ranked_nodes(cm: CalibratedModel, sensitivity: Dict[str, Dict[str, Dict[str, float]]]) -> Dict[str, float]:
    """Ordinary nodes by output cosine, most sensitive first: the node table, plus the
    calibration of each *model output* charged to the node producing it.

    Quantizing a node means quantizing its inputs (the seed's node_type 'node'), so
    no node's row ever quantizes a model output: a probability map whose small
    values round to 0 in int8 only shows in the activation table. It is charged
    to its producer here, whose remedy (the CPU, or int16 output) fixes it.
    """
    cos = METRICS["cosine-similarity"].name
    out = {n: v[cos] for n, v in sensitivity.get("node", {}).items() if cos in v}
    for name, v in sensitivity.get("activation", {}).items():
        c = cm.calibrations.get(name)
        node = cm.maker(c.input) if c is not None else None
        if node is None or cos not in v or c.consumers:
            continue
        out[node] = min(out.get(node, 1.0), v[cos])
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def remedy_gains(cm: CalibratedModel, ev: Evaluator, choice: Dict[str, str]):
    """(cosine of the calibrated model, {node: cosine with that node's remedy applied}), best first.

    The remedy is simulated on the calibrated model, everything else quantized:
    'cpu' keeps all of the node's calibrations float (weights too), 'int16'
    keeps the activations node_info int16 widens float (its inputs and outputs;
    int16 is within 1/258 of an int8 step of float) and its weights int8.
    """
    cos = METRICS["cosine-similarity"]
    base = ev.score(None, [cos])[cos.name]
    out = {}
    for n, how in choice.items():
        off = cm.int16_calibrations(n) if how == "int16" else cm.calibrations_of(n) + cm.output_calibrations(n)
        out[n] = ev.score(all_but(cm, off), [cos])[cos.name]
    return base, dict(sorted(out.items(), key=lambda kv: -kv[1]))


#: A sample's output is "blank" when its largest |value| is below this fraction of the largest over all samples.
BLANK_FRACTION = 1e-3


def blank_mask(ev: Evaluator) -> List[bool]:
    """Per sample: some output is (nearly) all zeros in the float model (a per-pixel map of an
    image without objects). Such a cosine is 0 or 1 by definition (DESIGN.md, blank inputs)."""
    mask = [False] * len(ev.reference)
    for k in range(len(ev.tensors)):
        peaks = [float(np.max(np.abs(r[k]), initial=0.0)) for r in ev.reference]
        top = max(peaks, default=0.0)
        for i, p in enumerate(peaks):
            mask[i] |= top > 0 and p <= BLANK_FRACTION * top
    return mask


def blank_samples(ev: Evaluator) -> Dict[str, int]:
    """output -> how many samples have a (nearly) all-zero float output (see ``blank_mask``)."""
    out = {}
    for k, name in enumerate(ev.tensors):
        peaks = [float(np.max(np.abs(r[k]), initial=0.0)) for r in ev.reference]
        top = max(peaks, default=0.0)
        n = sum(1 for p in peaks if p <= BLANK_FRACTION * top)
        if n and top > 0:
            out[name] = n
    return out


def advised_nodes(res: "RunallResult", top: int = TOP) -> List[str]:
    """The sensitive nodes whose float version helps the quantized model, most first (at most ``top``)."""
    return [n for n, c in res.float_one.items() if c > res.quantized_cosine][:top]


def best_remedies(cm: CalibratedModel, ev: Evaluator, nodes: Sequence[str]):
    """Both remedies simulated for each node (``remedy_gains``); per node the better one.
    Returns (cosine of the calibrated model, {node: cosine with its better remedy}, {node: remedy})."""
    base, as16 = remedy_gains(cm, ev, {n: "int16" for n in nodes})
    _, oncpu = remedy_gains(cm, ev, {n: "cpu" for n in nodes})
    choice = {n: "int16" if as16[n] >= oncpu[n] else "cpu" for n in nodes}
    best = {n: max(as16[n], oncpu[n]) for n in nodes}
    return base, dict(sorted(best.items(), key=lambda kv: -kv[1])), choice


def remedies(cm: CalibratedModel, sensitivity: Dict[str, Dict[str, Dict[str, float]]],
             nodes: Sequence[str]) -> Dict[str, str]:
    """node -> 'int16' or 'cpu', the seed's two remedies, chosen per node:

    * a node ranked by the *model output* it makes (``ranked_nodes``) -> int16
      inputs and output: the output keeps its small values (the seed's
      set_model_output_int16) and the op reads a fine-grained input;
    * a node whose *weight* calibration costs more than its input activations' ->
      the CPU, in float: X5 int16 widens activations only, weights stay int8;
    * a tail node (nothing active after it) -> the CPU (the seed's advice for tail ops);
    * otherwise -> int16 inputs and output (node_info InputType/OutputType).

    ``sensitivity`` holds the 'node', 'weight' and 'activation' tables
    (cosine-similarity) as runall computes them.
    """
    cos = METRICS["cosine-similarity"].name
    tails = tail_nodes(cm)
    weights = sensitivity.get("weight", {})
    acts = sensitivity.get("activation", {})
    own = sensitivity.get("node", {})
    ranked = ranked_nodes(cm, sensitivity)
    out = {}
    for n in nodes:
        mine = cm.calibrations_of(n)
        w = [weights[c][cos] for c in mine if c in weights and cos in weights[c]]
        a = [acts[c][cos] for c in mine if c in acts and cos in acts[c]]
        if n in ranked and ranked[n] < own.get(n, {}).get(cos, 1.0):
            out[n] = "int16"
        elif w and (not a or min(w) < min(a)):
            out[n] = "cpu"
        else:
            out[n] = "cpu" if n in tails else "int16"
    return out


def node_info_yaml(choice: Dict[str, str]) -> str:
    return "node_info: {" + ", ".join(
        f"{n}: {{'ON': 'CPU'}}" if how == "cpu" else f"{n}: {{'InputType': 'int16', 'OutputType': 'int16'}}"
        for n, how in choice.items()) + "}"


def _advice(cm: CalibratedModel, res: RunallResult, pick_threshold: float) -> List[str]:
    out = []
    for f in res.joins:
        if f.collapsed:
            out.append(f.warning())
    nodes = ranked_nodes(cm, res.sensitivity)
    sensitive = [n for n, v in nodes.items() if v < pick_threshold][:TOP]
    hurt = []
    if res.float_one:
        hurt = [n for n in sensitive if n in res.float_one and res.float_one[n] <= res.quantized_cosine]
        sensitive = advised_nodes(res)
    if sensitive:
        choice = {n: res.remedy[n] for n in sensitive} if res.remedy else remedies(cm, res.sensitivity, sensitive)
        tails = tail_nodes(cm)

        own = res.sensitivity.get("node", {})

        def why(n):
            if nodes[n] < own.get(n, {}).get(METRICS["cosine-similarity"].name, 1.0):
                return "its model output"
            if choice[n] == "int16":
                return "activations"
            return "tail node" if n in tails else "float weights help: X5 int16 keeps weights int8"
        gain = (lambda n: f", with it: {res.float_one[n]:.5f}") if res.float_one else (lambda n: "")
        out.append("most quantization-sensitive nodes: " + ", ".join(
            f"{n} ({nodes[n]:.5f}{gain(n)}, {why(n)})" for n in sensitive) + "; try " + node_info_yaml(choice))
    if hurt:
        out.append("ranked sensitive, but their remedy alone, simulated in the quantized model on these samples, does "
                   f"not raise its output cosine {res.quantized_cosine:.5f} (errors of different nodes can cancel): " +
                   ", ".join(f"{n} ({res.remedy.get(n, '?')}: {res.float_one[n]:.5f})" for n in hurt) +
                   "; if you try them, try them together and judge on held-out data")
    for name, n in res.blank.items():
        out.append(f"{n} of {res.samples} sample(s) give a nearly all-zero float output {name} (below "
                   f"{BLANK_FRACTION:g} of its peak): the cosine of such an output is 0 (quantized to all zeros) or "
                   "1 by definition and moves every figure above; judge those samples by max abs error (chebyshev), "
                   "or leave them out of data_num")
    ends = {k: list(v.values())[-1] for k, v in res.acc_error.items() if v}
    if "weight" in ends and "activation" in ends:
        worse = "activation" if ends["activation"] < ends["weight"] else "weight"
        out.append(f"quantizing only weights ends at {ends['weight']:.5f}, only activations at {ends['activation']:.5f} "
                   f"(last node, cosine-similarity if that is the metric): {worse} quantization costs more" +
                   ("; try another calibration_type (kl, max with max_percentile) or int16 on the sensitive activations"
                    if worse == "activation" else "; check the weight distributions above for outlier channels"))
    cum = res.analysis.get("cumulative", {})
    if len(cum) > 1:
        keys = list(cum)
        best = max(keys[1:], key=lambda k: cum[k])
        k = keys.index(best)
        out.append(f"keeping the {k} most sensitive node(s) up to {best} in float raises the output cosine from "
                   f"{cum['none']:.5f} to {cum[best]:.5f} (sensitivity analysis)")
    if not out:
        out.append(f"no node is below pick_threshold {pick_threshold} and no output hides a collapsed part: "
                   "quantization error is spread over many nodes; try calibration_type / per_channel settings")
    return out


def _write(path: str, text: str) -> str:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


def index_html(res: RunallResult, model: str) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'><title>hmct-debugger runall</title>",
             "<style>body{font-family:sans-serif;margin:20px;max-width:1400px}pre{background:#f4f4f4;padding:8px;"
             "overflow-x:auto;font-size:12px}img{max-width:100%;border:1px solid #ccc}figure{margin:16px 0}"
             "li{margin:6px 0}.warn{color:#a00}</style></head><body>",
             f"<h1>hmct-debugger runall</h1><p>model: <code>{esc(model)}</code>; {res.seconds:.1f} s</p>",
             "<h2>Summary: what to try</h2><ol>"]
    parts += [f"<li class='{'warn' if 'Remedy' in a else ''}'>{esc(a)}</li>" for a in res.advice]
    parts.append("</ol>")
    if res.joins:
        parts.append("<h2>Outputs fed by a Concat, part by part</h2><pre>" +
                     esc("\n".join(line for f in res.joins for line in f.report_lines())) + "</pre>")
    for title, text in res.tables.items():
        parts.append(f"<h2>{esc(title)}</h2><pre>{esc(text)}</pre>")
    parts.append("<h2>Figures</h2>")
    for caption, path in res.figures.items():
        rel = os.path.relpath(path, res.save_dir)
        parts.append(f"<figure><img src='{esc(rel)}' alt='{esc(caption)}'><figcaption>{esc(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _top(result: Dict[str, Dict[str, float]]) -> List[str]:
    return list(result)[:TOP]


@dataclass
class _Run:
    """What every runall step reads: the model, the samples, the options, and the result it fills in."""

    cm: CalibratedModel
    samples: list
    save_dir: str
    metrics: list
    res: RunallResult
    output_node: Optional[str]
    node_type: str
    pick_threshold: float

    def write(self, name: str, text: str) -> str:
        return _write(os.path.join(self.save_dir, name), text)


def runall(model_or_file=None, calibrated_data=None, save_dir: Optional[str] = None, ns_metrics="cosine-similarity",
           output_node: Optional[str] = None, node_type: str = "node", data_num: Optional[int] = None,
           verbose: bool = False, interested_nodes: Optional[Sequence[str]] = None,
           dis_nodes_list: Optional[Sequence[str]] = None, cw_nodes_list: Optional[Sequence[str]] = None,
           axis: Optional[int] = None, quantize_node=None, non_quantize_node=None, ae_metric: str = "cosine-similarity",
           average_mode: bool = False, pick_threshold: float = 0.999,
           sensitive_nodes: Optional[Sequence[str]] = None) -> RunallResult:
    """Run every analysis; writes tables, PNGs, summary.txt and index.html into ``save_dir``
    (default ./debug_result)."""
    t0 = time.time()
    run = _start(model_or_file, calibrated_data, save_dir, ns_metrics, ae_metric, data_num, output_node, node_type,
                 pick_threshold, interested_nodes, dis_nodes_list, cw_nodes_list, sensitive_nodes)
    # One float run per sample serves steps 1-2, the node sensitivity steps 3 and 6 use, and the remedy check.
    ev = Evaluator(run.cm, run.samples, output_tensors(run.cm, output_node))
    _sensitivities(run, ev, interested_nodes, verbose)                       # steps 1-2
    _distributions(run, dis_nodes_list, cw_nodes_list, axis)                  # steps 3-4
    _accumulated_errors(run, quantize_node, non_quantize_node, ae_metric, average_mode)   # step 5
    _sensitivity_analysis(run, ev, sensitive_nodes)                           # step 6
    _remedy_check(run, ev)
    _output_parts(run)                                                        # step 7
    return _summarize(run, time.time() - t0)


def _start(model_or_file, calibrated_data, save_dir, ns_metrics, ae_metric, data_num, output_node, node_type,
           pick_threshold, interested_nodes, dis_nodes_list, cw_nodes_list, sensitive_nodes) -> _Run:
    """The model and samples loaded, every node name the caller gave checked, the folder made."""
    cm = load_model(model_or_file)
    metrics = resolve_metrics(ns_metrics)
    resolve_metrics(ae_metric)
    data = load_data(calibrated_data, cm)
    samples = data.first(data_num)
    for names, what in ((interested_nodes, "interested node"), (dis_nodes_list, "dis_nodes_list node"),
                        (sensitive_nodes, "sensitive node")):
        if names:
            cm.check_names(names, what)
    if cw_nodes_list:
        cm.check_names(cw_nodes_list, "cw_nodes_list node", calibration_only=True)
    save_dir = save_dir or DEFAULT_DIR
    os.makedirs(save_dir, exist_ok=True)
    return _Run(cm, samples, save_dir, metrics, RunallResult(save_dir), output_node, node_type, pick_threshold)


def _sensitivities(run: _Run, ev: Evaluator, interested_nodes, verbose: bool) -> None:
    """Steps 1-2: weight, activation and ordinary node sensitivity (or that of ``interested_nodes``)."""
    cm, res = run.cm, run.res
    res.blank, res.samples = blank_samples(ev), len(run.samples)
    cos = METRICS["cosine-similarity"]
    with_cos = run.metrics + ([cos] if cos not in run.metrics else [])
    kinds = ["node"] if interested_nodes else ["weight", "activation", "node"]
    for kind in kinds:
        cands = candidates_for(cm, kind, interested_nodes)
        full = rank(cm, run.samples, with_cos if kind == "node" else run.metrics, cands, evaluator=ev)
        res.sensitivity[kind] = full
        shown = {k: {m.name: v[m.name] for m in run.metrics} for k, v in full.items()}
        text = sensitivity_table(cm, shown, kind if not interested_nodes else "node")
        res.tables[f"{kind} sensitivity" if not interested_nodes else "interested node sensitivity"] = text
        run.write(f"{kind}_sensitivity.txt", text + "\n")
        if verbose:
            print(text, flush=True)


def _distributions(run: _Run, dis_nodes_list, cw_nodes_list, axis) -> None:
    """Steps 3-4: distributions and channel-wise box plots of the most sensitive nodes (or of the lists given)."""
    cm, res = run.cm, run.res
    if dis_nodes_list:
        dis = list(dis_nodes_list)
    else:
        dis = _top(res.sensitivity.get("weight", {})) + _top(res.sensitivity.get("activation", {}))
        if run.node_type == "node":  # those with a float output to plot (not ArgMax's indices)
            dis += [n for n in _top(res.sensitivity.get("node", {})) if n in cm.observed and cm.is_float(cm.observed[n])]
    dis = list(dict.fromkeys(dis))
    if dis:
        for node, path in distribution.distributions(cm, run.samples, dis, run.save_dir).items():
            res.figures[f"distribution of {node}"] = path
    cw = list(cw_nodes_list) if cw_nodes_list else [n for n in dis if n in cm.calibrations]
    if not cw_nodes_list and run.node_type == "node":
        for n in _top(res.sensitivity.get("node", {})):
            cw += cm.calibrations_of(n)
    cw = list(dict.fromkeys(cw))
    if cw:
        for node, path in distribution.channelwise(cm, run.samples, cw, run.save_dir, axis).items():
            res.figures[f"channel-wise distribution of {node}"] = path


def _accumulated_errors(run: _Run, quantize_node, non_quantize_node, ae_metric: str, average_mode: bool) -> None:
    """Step 5: cumulative error curves (only weights / only activations quantized, or the nodes given)."""
    res, save_dir = run.res, run.save_dir
    if quantize_node or non_quantize_node:
        res.acc_error = acc_error.acc_error(run.cm, run.samples, quantize_node, non_quantize_node, ae_metric,
                                            average_mode, save_dir, "acc_error.png")
        res.figures["accumulate error"] = os.path.join(save_dir, "acc_error.png")
    else:
        res.acc_error = acc_error.acc_error(run.cm, run.samples, ["weight", "activation"], None, ae_metric,
                                            average_mode, save_dir, "acc_error_weight_activation.png",
                                            "accumulate error: only weights / only activations quantized")
        res.figures["accumulate error, weights only vs activations only"] = os.path.join(
            save_dir, "acc_error_weight_activation.png")


def _sensitivity_analysis(run: _Run, ev: Evaluator, sensitive_nodes) -> None:
    """Step 6: sensitivity analysis of the nodes below pick_threshold (or of ``sensitive_nodes``)."""
    cm, res = run.cm, run.res
    if sensitive_nodes:
        picked = list(dict.fromkeys(sensitive_nodes))
    else:
        picked = [n for n, c in ranked_nodes(cm, res.sensitivity).items() if c < run.pick_threshold][:MAX_ANALYSED]
    if picked:
        float_ev = ev if run.output_node is None else Evaluator(cm, run.samples)
        res.analysis = analysis.analyse(cm, run.samples, picked, run.save_dir, float_ev, with_outputs=True)
        res.figures["sensitivity analysis"] = os.path.join(run.save_dir, analysis.FILE)


def _remedy_check(run: _Run, ev: Evaluator) -> None:
    """The advice's own check: does keeping each sensitive node float, with everything else
    quantized, actually help? Errors of different nodes can cancel, so "only this node
    quantized" (the ranking) and "all but this node quantized" (what a remedy does) disagree."""
    if run.output_node is not None:
        return
    cm, res = run.cm, run.res
    # On the samples whose outputs are not blank: a blank output's cosine says nothing about a remedy.
    blank = blank_mask(ev)
    check = ev.subset([not b for b in blank]) if any(blank) and not all(blank) else ev
    candidates = [n for n, c in ranked_nodes(cm, res.sensitivity).items() if c < run.pick_threshold][:MAX_CHECKED]
    res.quantized_cosine, res.float_one, res.remedy = best_remedies(cm, check, candidates)
    if res.float_one:
        text = "\n".join(f"{n:<40}{res.remedy[n]:<6}{c:.5f}  ({c - res.quantized_cosine:+.5f})"
                          for n, c in res.float_one.items())
        title = (f"output cosine with one node's remedy applied (calibrated model: {res.quantized_cosine:.5f}"
                 f"{', samples with a blank output left out' if check is not ev else ''})")
        res.tables[title] = text
        run.write("remedy_check.txt", title + "\n" + text + "\n")


def _output_parts(run: _Run) -> None:
    """Step 7: every model output fed by a Concat, part by part: outputs one cosine hides."""
    cm, res = run.cm, run.res
    res.joins = check_joins(cm.fakequant(()), cm.fakequant(None), run.samples)
    float_name = {c.output: c.input for c in cm.calibrations.values()}
    for f in res.joins:      # name the parts by the model's tensors, not the calibration nodes' outputs
        for part in f.parts:
            part.tensor = float_name.get(part.tensor, part.tensor)
    if res.joins:
        run.write("output_parts.txt", "\n".join(l for f in res.joins for l in f.report_lines()) + "\n")


def _summarize(run: _Run, seconds: float) -> RunallResult:
    """What to try, most promising first: summary.txt and index.html."""
    res = run.res
    res.advice = _advice(run.cm, res, run.pick_threshold)
    res.seconds = seconds
    run.write("summary.txt", "\n".join(f"{i}. {a}" for i, a in enumerate(res.advice, 1)) + "\n")
    run.write("index.html", index_html(res, run.cm.source))
    return res
