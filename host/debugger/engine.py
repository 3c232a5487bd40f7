"""Running partially quantized versions of a calibrated model against the float one.

A *candidate* is a set of enabled calibration nodes: those quantize (a
QuantizeLinear + DequantizeLinear pair), the others pass the float value
through. The float model is the candidate with nothing enabled.

Cost rules (a 100-node model and 10 samples must take seconds, not minutes):
the float model runs once per sample and its outputs are kept, and no
candidate builds a model or a session of its own. ``SwitchModel`` builds ONE
model in which every calibration node is
``Where(<node>__on, DequantizeLinear(QuantizeLinear(x)), x)`` with a boolean
graph input per node, and ONE onnxruntime InferenceSession (the board
runtime's session options, QDQ fusion off); a candidate is a set of flags fed
with each sample. ``Where`` passes either branch through unchanged, so the
figures are those of ``calibrated_to_fakequant(model, enabled)`` up to float
rounding (onnxruntime fuses float ops differently around the Where nodes:
about 1e-7 relative, checked in tests/host/test_debugger.py).
"""
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper
from tqdm import tqdm

from bpuemu.common.compare import METRICS, Metric
from bpuemu.common.errors import InvalidInput
from bpuemu.host.debugger.data import CalibratedModel, Sample
from bpuemu.host.quant.graph import feed_for, session, with_outputs


def resolve_metrics(metrics) -> List[Metric]:
    """A metric name or list of names -> Metric objects; one clear error for an unknown name."""
    names = [metrics] if isinstance(metrics, str) else list(metrics or ["cosine-similarity"])
    if not names:
        names = ["cosine-similarity"]
    out = []
    for m in names:
        if m not in METRICS:
            raise InvalidInput(f"unknown metric '{m}'; choose from {', '.join(METRICS)}")
        out.append(METRICS[m])
    return out


def progress(iterable, desc: str, total: Optional[int] = None):
    """A tqdm bar on stderr that disappears when done (long loops over nodes or samples)."""
    return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)


FLAG_SUFFIX = "__on"


def switch_model(cm: CalibratedModel) -> onnx.ModelProto:
    """The calibrated model with a boolean input ``<calibration node>__on`` per calibration node
    choosing its quantized or its float value (see the module docstring)."""
    m = cm.fakequant(None)   # every calibration node as Q -> DQ, the DQ writing the node's output
    g = m.graph
    by_output = {n.output[0]: n for n in g.node if n.op_type == "DequantizeLinear"}
    producer = {o: n for n in g.node for o in n.output}
    extra = []
    for c in cm.calibrations.values():
        dq = by_output.get(c.output)
        q = producer.get(dq.input[0]) if dq is not None else None
        if q is None or q.op_type != "QuantizeLinear":
            raise InvalidInput(f"cannot build the switch model: calibration node {c.name} has no Q/DQ pair")
        quantized = c.output + "__quantized"
        dq.output[0] = quantized
        flag = c.name + FLAG_SUFFIX
        g.input.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, []))
        extra.append((dq.name, helper.make_node("Where", [flag, quantized, q.input[0]], [c.output], name=c.name + "_switch")))
    after = dict(extra)
    nodes = []
    for n in g.node:
        nodes.append(n)
        if n.name in after:
            nodes.append(after[n.name])
    del g.node[:]
    g.node.extend(nodes)
    return m


class _RealInputs:
    """The session's model inputs without the switch flags (for feed_for)."""

    def __init__(self, sess):
        self._inputs = [i for i in sess.get_inputs() if not i.name.endswith(FLAG_SUFFIX)]

    def get_inputs(self):
        return self._inputs


class SwitchModel:
    """One session answering every candidate: ``run(enabled, sample)``."""

    def __init__(self, cm: CalibratedModel, tensors: Sequence[str]):
        self.cm = cm
        self.tensors = list(tensors)
        model = switch_model(cm)
        if set(self.tensors) - set(cm.outputs):
            model = with_outputs(model, self.tensors, cm.infos)
        self.sess = session(model)
        self._real = _RealInputs(self.sess)
        self._on = {c: np.array(True) for c in cm.calibrations}
        self._feeds: Dict[int, Dict[str, np.ndarray]] = {}

    def flags(self, enabled: Optional[Sequence[str]]) -> Dict[str, np.ndarray]:
        on = set(self.cm.calibrations) if enabled is None else set(enabled)
        return {c + FLAG_SUFFIX: np.array(c in on) for c in self.cm.calibrations}

    def run(self, flags: Dict[str, np.ndarray], sample: Sample, key: Optional[int] = None) -> List[np.ndarray]:
        feed = self._feeds.get(key) if key is not None else None
        if feed is None:
            feed = feed_for(self._real, sample)
            if key is not None:
                self._feeds[key] = feed
        return self.sess.run(self.tensors, {**feed, **flags})


class Evaluator:
    """Scores candidates on fixed samples, comparing ``tensors`` (default: the model outputs)."""

    def __init__(self, cm: CalibratedModel, samples: Sequence[Sample], tensors: Optional[Sequence[str]] = None):
        self.cm = cm
        self.samples = list(samples)
        self.tensors = list(tensors) if tensors else list(cm.outputs)
        self.model = SwitchModel(cm, self.tensors)
        off = self.model.flags(())
        self.reference: List[List[np.ndarray]] = [
            self.model.run(off, s, i) for i, s in enumerate(progress(self.samples, "float model runs"))]

    def outputs(self, enabled: Optional[Sequence[str]]) -> List[List[np.ndarray]]:
        flags = self.model.flags(enabled)
        return [self.model.run(flags, s, i) for i, s in enumerate(self.samples)]

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
    readers: Dict[str, List[str]] = {}
    for n in cm.ordinary:
        for i in n.input:
            readers.setdefault(i, []).append(n.name)
    out = []
    for n in cm.ordinary:
        t = cm.observed.get(n.name)
        if t is None or not cm.is_float(t):
            continue
        r = readers.get(t, [])
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
    model = SwitchModel(cm, tensors)
    off = model.flags(())
    flags = {label: model.flags(enabled) for label, enabled in candidates.items()}
    sums = {label: np.zeros(len(tensors)) for label in candidates}
    for s in progress(samples, "samples"):
        ref = model.run(off, s)
        for label, f in flags.items():
            got = model.run(f, s)
            sums[label] += [metric(r, g) for r, g in zip(ref, got)]
    pos = {t: i for i, t in enumerate(tensors)}
    n = max(1, len(samples))
    return {label: {node: float(sums[label][pos[t]] / n) for node, t in pairs} for label in candidates}
