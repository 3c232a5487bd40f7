"""plot_acc_error: how the error of a partially quantized model grows from node to node.

For each partial model, every ordinary node's output is compared with the
float model's (averaged over the samples) and drawn in topological order.

``quantize_node``: those nodes quantized, the rest float; ``non_quantize_node``:
those float, the rest quantized. A flat list makes one model per item, a
nested list one model per sublist; ``'weight'`` / ``'activation'`` stand for
every weight / activation calibration node. With ``average_mode`` the n-th
point is the mean of the first n (so [1.0, 0.9, 0.9, 0.8] -> [1.0, 0.95, 0.933, 0.9]).
"""
import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

from bpuemu.common.errors import InvalidInput
from bpuemu.host.debugger import plots
from bpuemu.host.debugger.data import CalibratedModel, load_data, load_model
from bpuemu.host.debugger.engine import all_but, resolve_metrics, tensor_curves

SPECIAL = ("weight", "activation")
FILE = "acc_error.png"


def is_nested(values) -> bool:
    return isinstance(values, (list, tuple)) and any(isinstance(v, (list, tuple)) for v in values)


def _as_list(values) -> List:
    if values is None:
        return []
    if isinstance(values, str):
        return [values]
    return list(values)


def _members(cm: CalibratedModel, names: Sequence[str]) -> List[str]:
    """The calibration nodes a group of names stands for ('weight'/'activation' expanded)."""
    out: List[str] = []
    for n in names:
        out += cm.of_kind(n) if n in SPECIAL else cm.calibrations_of(n)
    return list(dict.fromkeys(out))


def partial_models(cm: CalibratedModel, quantize_node, non_quantize_node) -> Dict[str, List[str]]:
    """label -> enabled calibration nodes, for the seed's quantize_node / non_quantize_node forms."""
    q, nq = _as_list(quantize_node), _as_list(non_quantize_node)
    if not q and not nq:
        raise InvalidInput("give quantize_node or non_quantize_node (at least one of them)")
    both = bool(q) and bool(nq)
    out: Dict[str, List[str]] = {}
    for values, quantize in ((q, True), (nq, False)):
        nested = is_nested(values)
        groups: List[Tuple[str, List[str]]] = []
        for i, v in enumerate(values):
            names = [str(x) for x in _as_list(v)] if nested else [str(v)]
            cm.check_names([n for n in names if n not in SPECIAL], "quantize_node" if quantize else "non_quantize_node")
            label = f"partial_qmodel_{i}" if nested else names[0]
            if both:
                label = ("quantize " if quantize else "float ") + label
            groups.append((label, names))
        for label, names in groups:
            members = _members(cm, names)
            out[label] = members if quantize else all_but(cm, members)
    return out


def averaged(curve: Dict[str, float]) -> Dict[str, float]:
    out, total = {}, 0.0
    for i, (k, v) in enumerate(curve.items(), 1):
        total += v
        out[k] = total / i
    return out


def acc_error(cm: CalibratedModel, samples, quantize_node=None, non_quantize_node=None, metric: str = "cosine-similarity",
              average_mode: bool = False, save_dir: Optional[str] = None, file: str = FILE,
              title: str = "accumulate error") -> Dict[str, Dict[str, float]]:
    m = resolve_metrics(metric)[0]
    candidates = partial_models(cm, quantize_node, non_quantize_node)
    curves = tensor_curves(cm, samples, candidates, m)
    if average_mode:
        curves = {k: averaged(v) for k, v in curves.items()}
    if save_dir is not None:
        plots.error_curves(os.path.join(save_dir, file), curves, m.name,
                           title + (" (average_mode)" if average_mode else ""))
    return curves


def plot_acc_error(
    save_dir: Optional[str] = None,
    calibrated_data=None,
    model_or_file=None,
    quantize_node: Union[List, str, None] = None,
    non_quantize_node: Union[List, str, None] = None,
    metric: str = "cosine-similarity",
    average_mode: bool = False,
) -> Dict[str, Dict[str, float]]:
    """Cumulative error curves; writes ``acc_error.png`` in ``save_dir`` (default: the current directory).

    Returns {partial model label: {node: metric}} in topological order.
    """
    cm = load_model(model_or_file)
    data = load_data(calibrated_data, cm)
    return acc_error(cm, data.first(None), quantize_node, non_quantize_node, metric, average_mode,
                     save_dir if save_dir is not None else ".")
