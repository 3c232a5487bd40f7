"""Running partially quantized versions of a calibrated model against the float one.

A *candidate* is a set of enabled calibration nodes: those quantize (a
QuantizeLinear + DequantizeLinear pair), the others pass the float value
through (``calibrated_to_fakequant``). The float model is the candidate with
nothing enabled.

Cost rules (a 100-node model and 10 samples must take seconds, not minutes):
the float model runs once per sample and its outputs are kept; each candidate
gets one onnxruntime InferenceSession (the board runtime's session options,
QDQ fusion off), which then runs every sample. One model for all candidates,
with a boolean switch input per calibration node (Where(on, DQ(Q(x)), x)), was
measured 3x slower on PP-OCRv4 det (20 candidates x 6 samples: 22.6 s against
7.6 s): every Q/DQ pair always runs and onnxruntime fuses nothing around the
Where nodes, while building a session costs ~0.1 s.
"""
from typing import Dict, List, Optional, Sequence

import numpy as np
from tqdm import tqdm

from bpuemu.common.compare import METRICS, Metric
from bpuemu.common.errors import InvalidInput
from bpuemu.host.debugger.data import CalibratedModel, Sample
from bpuemu.host.onnxgraph import feed_for, open_session, with_outputs


def resolve_metrics(metrics) -> List[Metric]:
    """A metric name, a Metric, or a list of them -> Metric objects; one clear error for anything else.

    A ``Metric(name, fn, higher_is_better)`` of the caller's own measures what
    the model is for (``fn(float_output, quantized_output) -> float``, per
    sample and compared tensor, then averaged over samples): a task metric
    where one cosine over an output ranks candidates the wrong way.
    """
    names = [metrics] if isinstance(metrics, (str, Metric)) else list(metrics or ["cosine-similarity"])
    if not names:
        names = ["cosine-similarity"]
    out = []
    for m in names:
        if isinstance(m, Metric):
            out.append(m)
        elif isinstance(m, str) and m in METRICS:
            out.append(METRICS[m])
        else:
            raise InvalidInput(f"unknown metric {m!r}; choose from {', '.join(METRICS)}, or give a "
                               "Metric(name, fn, higher_is_better)")
    taken = [m.name for m in out]
    if len(set(taken)) != len(taken):
        raise InvalidInput(f"metric names must differ: {', '.join(taken)}")
    return out


def progress(iterable, desc: str, total: Optional[int] = None):
    """A tqdm bar on stderr that disappears when done (long loops over nodes or samples)."""
    return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)


class Evaluator:
    """Scores candidates on fixed samples, comparing ``tensors`` (default: the model outputs, an
    integer one at the float tensor it is computed from: ``CalibratedModel.compared_outputs``)."""

    def __init__(self, cm: CalibratedModel, samples: Sequence[Sample], tensors: Optional[Sequence[str]] = None):
        self.cm = cm
        self.samples = list(samples)
        self.tensors = list(tensors) if tensors else cm.compared_outputs()
        float_sess = self.session(())
        self._feeds = [feed_for(float_sess, s) for s in self.samples]   # cast once (same inputs in every candidate)
        self.reference: List[List[np.ndarray]] = [
            float_sess.run(self.tensors, f) for f in progress(self._feeds, "float model runs")]

    def subset(self, keep: Sequence[bool]) -> "Evaluator":
        """The same evaluator on the samples where ``keep`` is true (no model runs again)."""
        sub = object.__new__(Evaluator)
        sub.cm, sub.tensors = self.cm, self.tensors
        sub.samples = [s for s, k in zip(self.samples, keep) if k]
        sub._feeds = [f for f, k in zip(self._feeds, keep) if k]
        sub.reference = [r for r, k in zip(self.reference, keep) if k]
        return sub

    def session(self, enabled: Optional[Sequence[str]]):
        model = self.cm.fakequant(enabled)
        if set(self.tensors) - set(self.cm.outputs):
            model = with_outputs(model, self.tensors, self.cm.infos)
        return open_session(model)

    def outputs(self, enabled: Optional[Sequence[str]]) -> List[List[np.ndarray]]:
        sess = self.session(enabled)
        return [sess.run(self.tensors, f) for f in self._feeds]

    def score(self, enabled: Optional[Sequence[str]], metrics: Sequence[Metric]) -> Dict[str, float]:
        """Per metric: averaged over samples per compared tensor, then the worst tensor's figure
        (one broken output must not hide behind good ones)."""
        got = self.outputs(enabled)
        out = {}
        for m in metrics:
            per_tensor = [float(np.mean([m(ref[k], g[k]) for ref, g in zip(self.reference, got)]))
                          for k in range(len(self.tensors))]
            out[m.name] = min(per_tensor) if m.higher_is_better else max(per_tensor)
        return out


def all_but(cm: CalibratedModel, disabled: Sequence[str]) -> List[str]:
    """Every calibration node except ``disabled`` (a candidate that keeps those float)."""
    off = set(disabled)
    return [c for c in cm.calibrations if c not in off]


RELU_LIKE = ("Relu", "Clip")


def node_tensors(cm: CalibratedModel) -> List[tuple]:
    """(node, tensor) for every ordinary node whose (observed) first output is a float tensor,
    in topological order: the x-axis of the cumulative error curves.

    A node whose only reader is a Relu/Clip is read at that activation's output:
    the BPU computes the pair as one op, and the node's own output is quantized
    with the activation's range, so alone it would look broken (negatives
    clipped) where nothing is lost (as makertbin's cosine table does).
    """
    out = []
    for n in cm.ordinary:
        t = cm.observed.get(n.name)
        if t is None or not cm.is_float(t):
            continue
        r = cm.readers(t)
        if len(r) == 1 and cm.by_name[r[0]].op_type in RELU_LIKE and r[0] in cm.observed:
            t = cm.observed[r[0]]
        out.append((n.name, t))
    return out


def tensor_curves(cm: CalibratedModel, samples: Sequence[Sample], candidates: Dict[str, Optional[Sequence[str]]],
                  metric: Metric) -> Dict[str, Dict[str, float]]:
    """For each candidate: node -> the metric of that node's output against the float model's,
    averaged over samples. The float model runs once per sample; each candidate has one session."""
    pairs = node_tensors(cm)
    tensors = list(dict.fromkeys(t for _, t in pairs))
    float_sess = open_session(with_outputs(cm.fakequant(()), tensors, cm.infos))
    sessions = {label: open_session(with_outputs(cm.fakequant(enabled), tensors, cm.infos))
                for label, enabled in progress(candidates.items(), "candidate sessions", len(candidates))}
    sums = {label: np.zeros(len(tensors)) for label in candidates}
    for s in progress(samples, "samples"):
        feed = feed_for(float_sess, s)
        ref = float_sess.run(tensors, feed)
        for label, sess in sessions.items():
            got = sess.run(tensors, feed)
            sums[label] += [metric(r, g) for r, g in zip(ref, got)]
    pos = {t: i for i, t in enumerate(tensors)}
    n = max(1, len(samples))
    return {label: {node: float(sums[label][pos[t]] / n) for node, t in pairs} for label in candidates}
