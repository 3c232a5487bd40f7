"""get_sensitivity_of_nodes: quantize one thing at a time and rank by the output error.

node_type ``node``: each ordinary node with the calibration nodes on its
inputs (activations and weights) enabled, everything else float;
``weight``/``activation``: each calibration node of that kind alone.
``interested_nodes`` overrides node_type and may mix the three kinds.
"""
import sys
from typing import Dict, List, Optional, Sequence

from bpuemu.common.compare import Metric
from bpuemu.common.errors import InvalidInput
from bpuemu.host.debugger.data import KINDS, CalibratedModel, Sample, load_data, load_model
from bpuemu.host.debugger.engine import Evaluator, progress, resolve_metrics

DIGITS = 5


def output_tensors(cm: CalibratedModel, output_node: Optional[str]) -> Optional[List[str]]:
    """The tensors compared: the model outputs, or ``output_node``'s (quantized) output."""
    if output_node is None:
        return None
    cm.check_names([output_node], "output_node")
    if output_node in cm.calibrations:
        return [cm.calibrations[output_node].output]
    if output_node not in cm.observed or not cm.is_float(cm.observed[output_node]):
        raise InvalidInput(f"output_node '{output_node}' has no float output to compare")
    return [cm.observed[output_node]]


def candidates_for(cm: CalibratedModel, node_type: str, interested_nodes: Optional[Sequence[str]]) -> Dict[str, List[str]]:
    """name -> the calibration nodes enabled when that name alone is quantized."""
    if interested_nodes:
        cm.check_names(interested_nodes, "interested node")
        names = list(dict.fromkeys(interested_nodes))
    else:
        if node_type not in KINDS:
            raise InvalidInput(f"node_type '{node_type}' is not one of {', '.join(KINDS)}")
        names = cm.of_kind(node_type)
    out = {n: cm.calibrations_of(n) for n in names}
    empty = [n for n, c in out.items() if not c]
    if empty and interested_nodes:
        raise InvalidInput(f"node '{empty[0]}' reads no calibrated (quantized) tensor; nothing to quantize there")
    return {n: c for n, c in out.items() if c}


def rank(cm: CalibratedModel, samples: Sequence[Sample], metrics: Sequence[Metric], candidates: Dict[str, List[str]],
         tensors: Optional[Sequence[str]] = None, evaluator: Optional[Evaluator] = None) -> Dict[str, Dict[str, float]]:
    """name -> {metric: value}, most sensitive first by the first metric."""
    ev = evaluator or Evaluator(cm, samples, tensors)
    scores = {name: ev.score(enabled, metrics) for name, enabled in
              progress(candidates.items(), "node sensitivity (candidates)", len(candidates))}
    first = metrics[0]
    order = first.worst_first({k: v[first.name] for k, v in scores.items()})
    return {k: scores[k] for k in order}


def _fmt(v) -> str:
    return str(round(float(v), DIGITS)) if isinstance(v, float) else str(v)


def sensitivity_table(cm: CalibratedModel, result: Dict[str, Dict[str, float]], node_type: str) -> str:
    """The seed's verbose table for node_type node / weight / activation."""
    metric_names = list(next(iter(result.values())).keys()) if result else []
    if node_type == "weight":
        head = ["weight", "node"] + metric_names
        rows = [[k, cm.calibrations[k].node] + [_fmt(v[m]) for m in metric_names] for k, v in result.items()]
    elif node_type == "activation":
        head = ["activation", "node", "threshold", "bit"] + metric_names
        rows = [[k, cm.calibrations[k].node, _fmt(cm.calibrations[k].threshold), str(cm.calibrations[k].bit)] +
                [_fmt(v[m]) for m in metric_names] for k, v in result.items()]
    else:
        head = ["node"] + metric_names
        rows = [[k] + [_fmt(v[m]) for m in metric_names] for k, v in result.items()]
    widths = [max(len(x) for x in col) + 2 for col in zip(head, *rows)] if rows else [len(h) + 2 for h in head]
    widths[0] = max(widths[0], 22)
    line = lambda cells: "".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    total = sum(widths)
    title = "node sensitivity"
    pad = max(2, (total - len(title)) // 2)
    out = ["=" * pad + title + "=" * pad, line(head), "-" * total] + [line(r) for r in rows]
    return "\n".join(out)


def table_kind(cm: CalibratedModel, node_type: str, interested_nodes: Optional[Sequence[str]]) -> str:
    if interested_nodes:
        kinds = {cm.kind_of(n) for n in interested_nodes}
        return kinds.pop() if len(kinds) == 1 else "node"
    return node_type


def get_sensitivity_of_nodes(
    model_or_file,
    metrics="cosine-similarity",
    calibrated_data=None,
    output_node: Optional[str] = None,
    node_type: str = "node",
    data_num: Optional[int] = None,
    verbose: bool = False,
    interested_nodes: Optional[Sequence[str]] = None,
) -> Dict[str, Dict[str, float]]:
    """Node quantization sensitivity: {name: {metric: value}}, most sensitive first.

    Values are rounded to 5 decimals, as the seed prints them. With
    ``verbose`` the table is printed to stdout.
    """
    cm = load_model(model_or_file)
    ms = resolve_metrics(metrics)
    data = load_data(calibrated_data, cm)
    samples = data.first(data_num)
    tensors = output_tensors(cm, output_node)
    candidates = candidates_for(cm, node_type, interested_nodes)
    result = rank(cm, samples, ms, candidates, tensors)
    rounded = {k: {m: round(v, DIGITS) for m, v in vals.items()} for k, vals in result.items()}
    if verbose:
        print(sensitivity_table(cm, result, table_kind(cm, node_type, interested_nodes)), file=sys.stdout, flush=True)
    return rounded
