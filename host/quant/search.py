"""The calibration searches (ptq_faq_x5 6.6.1.4 / 6.6.1.5), node sensitivity, bias correction.

A candidate is judged by the *quantized model it produces* (the QDQ model
makertbin would ship, run with the runtime's session options) against the
float model: per model output, the cosine similarity averaged over the
evaluation samples (``search_samples`` calibration samples, 16 by default; the
seed's tool looks at the first one only, more is steadier: from
``search_held_out_from`` samples on, 48 by default, the last ones, held out of
the statistics, so that a candidate is judged on data it was not calibrated
on, as a user's images will be; with fewer, the first ones); the
candidate's score is the lowest of its outputs, so one broken output cannot
hide behind good ones (DESIGN.md). Ties go to the earlier candidate. An
integer output (ArgMax indices) is scored at the float tensor it is computed
from (``graph.scored_tensors``), and the log line names that tensor.

The default search's choice is the one scoring every candidate on every
evaluation sample would make, but a candidate is scored only as far as the
choice needs (``_Scoring``): a cosine is at most 1, so after k of n samples a
candidate's score is at most (its cosines' sum + n - k) / n; once that is below
the target (or below the best score, when choosing among candidates) the rest of
its samples cannot change the choice, and it is left there, its log line giving
the bound. On PP-OCRv4 det and cls that scores 32-36 of the 80 sample runs. Each
candidate's quantized model is made and its session opened once, on a thread of their own
while the sample workers score the earlier candidates, and the session stays open until the
candidate's last sample (det 640: 5 session openings instead of 15, one core's 1.0 s).

default:
  Step 1: max, max-percentile 0.99995, kl; best >= 0.995 -> done.
  Step 2: max-percentile 0.99995 with per-channel featuremap calibration
          (weights are per-channel in every candidate already); best of the
          four >= 0.995 -> done.
  Step 3: step 2's candidate (max-percentile 0.99995 + perchannel) with
          asymmetric quantization as the 5th candidate; the best of the five
          wins.
mix:
  Step 1: node sensitivity: the output cosine with only that node's inputs
          (activations and weights) quantized, the rest float, under the
          best uniform method (on the first ``mix_sensitivity_samples``
          samples: one model per node); the least similar nodes are the
          sensitive ones (at most ``mix_sensitive_nodes``, those below cosine
          0.99999).
  Step 2: for each sensitive node (worst first), try KL, Max and
          Max-0.99995 on its input activations, keep what scores best.
  Step 3: Mix against uniform KL, Max and Max-0.99995; the best wins.
"""
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx

from bpuemu.host.quant.calibrators import KL, MAX, Calibration, Method, ThresholdCache, activation_params, percentile_method
from bpuemu.host.quant.emit import calibrated_to_fakequant, calibration_nodes, emit_calibrated, emit_quantized
from bpuemu.common.compare import cosine_similarity as cosine
from bpuemu.host.onnxgraph import GraphIndex, feed_for, map_samples, open_session, with_outputs
from bpuemu.host.quant.graph import scored_outputs, scored_tensors
from bpuemu.host.quant.marking import QuantPlan
from bpuemu.host.quant.params import Candidate, TensorQuant, WeightQuant

SENSITIVE_BELOW = 0.99999


def output_cosines(reference: Sequence[Sequence[np.ndarray]], outputs: Sequence[Sequence[np.ndarray]], names: Sequence[str]) -> Dict[str, float]:
    """Per output name: the cosine similarity averaged over samples."""
    return {name: float(np.mean([cosine(r[k], o[k]) for r, o in zip(reference, outputs)])) for k, name in enumerate(names)}


def _per_output(per_sample: Sequence[Sequence[float]], names: Sequence[str]) -> Dict[str, float]:
    """Per output name: the mean over samples (in sample order) of the per-sample cosines."""
    return {name: float(np.mean([c[k] for c in per_sample])) for k, name in enumerate(names)}


class Evaluator:
    """Scores quantized models against the float model on a fixed set of samples."""

    def __init__(self, plan: QuantPlan, samples: Sequence[Mapping[str, np.ndarray]]):
        self.plan = plan
        self.samples = list(samples)
        self.names = [o.name for o in plan.model.graph.output]
        scored = scored_tensors(plan.model)
        #: integer output -> the float tensor it is scored at
        self.scored_at = {o: t for o, t in zip(self.names, scored) if o != t}
        self.evaluations = 0
        # The float model's outputs on the samples run on a thread of their own while the caller goes
        # on: the default search computes its first candidates' thresholds meanwhile (KL: about 1 s
        # on one core on PP-OCRv4 det), and the first cosine waits for them (``reference``).
        self._reference = _in_thread(lambda: scored_outputs(plan.model, self.samples)[1])

    @property
    def reference(self) -> List[List[np.ndarray]]:
        """Per sample, the float model's values of the scored tensors (waits for their runs)."""
        return self._reference.result()

    def session(self, model: onnx.ModelProto):
        """A session on ``model`` that outputs the tensors its outputs are scored at, and their names."""
        names = scored_tensors(model)
        return open_session(with_outputs(model, names), arena="shared"), names

    def cosines(self, sess, names: Sequence[str], first: int, count: int) -> List[List[float]]:
        """Per sample first..first+count-1: the cosine of each scored output against the float model's.
        Each worker reduces its sample's outputs to cosines at once (no sample's outputs are kept)."""
        return map_samples(sess, names, self.samples[first:first + count],
                           lambda i, outs: [cosine(r, o) for r, o in zip(self.reference[first + i], outs)])

    def score_model(self, model: onnx.ModelProto) -> Tuple[float, Dict[str, float]]:
        self.evaluations += 1
        sess, names = self.session(model)
        per_output = _per_output(self.cosines(sess, names, 0, len(self.samples)), self.names)
        return min(per_output.values()), per_output

    def score(self, acts: Dict[str, TensorQuant], weights: Dict[str, WeightQuant]) -> Tuple[float, Dict[str, float]]:
        return self.score_model(emit_quantized(self.plan, acts, weights))


#: Samples a candidate of the default search is scored on at a time (fixed, so that what is
#: scored does not depend on the number of sample workers; two keep both workers busy).
SCORE_STEP = 2
#: Added to a partial score's upper bound: more than the rounding of a mean of cosines.
BOUND_MARGIN = 1e-12


class _Scoring:
    """One default-search candidate scored sample by sample, as far as the choice needs.

    Its score is the lowest over outputs of the mean cosine over the n
    evaluation samples. A cosine is at most 1, so after k samples with sums
    S_o the score is at most min_o (S_o + n - k) / n (``bound``): a candidate
    whose bound is below what it must beat is out, whatever its other samples
    give. Once all n are scored, ``value`` is the score the exhaustive search
    computes (the same per-sample cosines, averaged the same way).
    """

    def __init__(self, index: int, calib: Calibration, acts: Dict[str, TensorQuant], weights, evaluator: Evaluator,
                 opener: Optional[ThreadPoolExecutor] = None):
        self.index, self.calib, self.acts, self.ev = index, calib, acts, evaluator
        self.per_sample: List[List[float]] = []
        # The quantized model and its session are made on ``opener``'s thread while earlier candidates
        # are scored (``extend`` waits for them), or at once without it.
        make = lambda: evaluator.session(emit_quantized(evaluator.plan, acts, weights))  # noqa: E731
        self._session = opener.submit(make) if opener is not None else _done(make())
        evaluator.evaluations += 1

    @property
    def total(self) -> int:
        return len(self.ev.samples)

    @property
    def exact(self) -> bool:
        return len(self.per_sample) == self.total

    def extend(self) -> None:
        """Score the next SCORE_STEP samples. The candidate's session stays open until its last
        sample (its tensors live in the shared arena between runs, so an open session holds its
        weights only), then it is closed."""
        sess, names = self._session.result()
        self.per_sample += self.ev.cosines(sess, names, len(self.per_sample), SCORE_STEP)
        if self.exact:
            self._session = None

    def per_output(self) -> Dict[str, float]:
        return _per_output(self.per_sample, self.ev.names) if self.exact else {}

    def value(self) -> float:
        return min(self.per_output().values())

    def bound(self) -> float:
        """An upper bound of the score (the score itself once exact)."""
        if self.exact:
            return self.value()
        left = self.total - len(self.per_sample)
        return min((sum(c[k] for c in self.per_sample) + left) / self.total
                   for k in range(len(self.ev.names))) + BOUND_MARGIN

    def candidate(self) -> Candidate:
        return Candidate(self.calib.name, self.bound(), self.per_output(), len(self.per_sample))


def _in_thread(fn) -> Future:
    """A future of ``fn()`` computed on a thread of its own (which ends with it)."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="bpuemu-reference")
    try:
        return pool.submit(fn)
    finally:
        pool.shutdown(wait=False)      # the thread ends after fn


def _done(value) -> Future:
    """A future that already holds ``value``."""
    f: Future = Future()
    f.set_result(value)
    return f


def _reaches(cands: Sequence[_Scoring], target: float) -> bool:
    """Whether the best score of ``cands`` is >= target, scoring no more samples than that needs."""
    while True:
        if any(c.exact and c.value() >= target for c in cands):
            return True
        open_ = [c for c in cands if not c.exact and c.bound() >= target]
        if not open_:
            return False
        max(open_, key=lambda c: (c.bound(), -c.index)).extend()


def _winner(cands: Sequence[_Scoring]) -> _Scoring:
    """The candidate of highest score, the earliest of equals (as max() over the exhaustive scores
    picks it), scoring no more samples than that needs: every other one is scored until its bound
    falls below the winner's score (or to its equal, when it comes later)."""
    while True:
        done = [c for c in cands if c.exact]
        best = max(done, key=lambda c: (c.value(), -c.index)) if done else None
        rivals = [c for c in cands if not c.exact and (best is None or c.bound() > best.value()
                                                       or (c.bound() == best.value() and c.index < best.index))]
        if not rivals:
            return best
        max(rivals, key=lambda c: (c.bound(), -c.index)).extend()


def _log_scoring(log: logging.Logger, c: _Scoring, evaluator: Evaluator) -> Candidate:
    cand = c.candidate()
    if c.exact:
        detail = "" if len(cand.per_output) < 2 else " (" + ", ".join(f"{k}: {v:.6f}" for k, v in cand.per_output.items()) + ")"
        line = f"output cosine similarity {cand.cosine:.6f}{detail}"
    else:
        line = (f"output cosine similarity <= {cand.cosine:.6f} (scored on {cand.samples} of {c.total} samples: "
                f"enough to rule it out)")
    line += "".join(f" (integer output {o} scored at its float input {t})" for o, t in evaluator.scored_at.items())
    log.info("calibration method %s: %s", c.calib.name, line)
    return cand


@dataclass
class SearchResult:
    acts: Dict[str, TensorQuant]
    method: str
    per_channel: bool
    asymmetric: bool
    candidates: List[Candidate]
    node_methods: Dict[str, str]


def _try(name: str, acts, weights, evaluator: Evaluator, log: logging.Logger, candidates: List[Candidate]) -> Candidate:
    cos, per_output = evaluator.score(acts, weights)
    cand = Candidate(name, cos, per_output)
    candidates.append(cand)
    detail = "" if len(per_output) < 2 else " (" + ", ".join(f"{k}: {v:.6f}" for k, v in per_output.items()) + ")"
    detail += "".join(f" (integer output {o} scored at its float input {t})" for o, t in evaluator.scored_at.items())
    log.info("calibration method %s: output cosine similarity %.6f%s", name, cos, detail)
    return cand


def log_selection(log: logging.Logger, method: str, per_channel: bool, asymmetric: bool) -> None:
    log.info("Select %s method.", method)
    if per_channel:
        log.info("Perchannel quantization is enabled.")
    if asymmetric:
        log.info("Asymmetric quantization is enabled.")


def default_candidates(percentile: float) -> List[Calibration]:
    """Every calibration the default search may try, in its order (steps 1, 2, 3)."""
    pct = percentile_method(percentile)
    return [Calibration(MAX), Calibration(pct), Calibration(KL), Calibration(pct, per_channel=True),
            Calibration(pct, per_channel=True, asymmetric=True)]


def mix_candidates(options) -> List[Calibration]:
    """Every calibration the mix search may assign."""
    return [Calibration(m, options.per_channel, options.asymmetric)
            for m in (KL, MAX, percentile_method(options.search_percentile))]


def default_search(plan: QuantPlan, cache: ThresholdCache, weights, evaluator: Evaluator, target: float,
                   percentile: float, log: logging.Logger, exhaustive: bool = False) -> SearchResult:
    """The default search (module docstring). Its choice is the exhaustive search's (every
    candidate scored on every evaluation sample; ``exhaustive=True`` runs that), but a candidate
    is scored only until the choice is certain (``_Scoring``): one that cannot reach the target
    or beat the best is left with the bound that rules it out, and its log line says so."""
    if exhaustive:
        return _exhaustive_default_search(plan, cache, weights, evaluator, target, percentile, log)
    calibs = default_candidates(percentile)
    scorings: List[_Scoring] = []
    # One thread makes the candidates' quantized models and opens their sessions while the sample
    # workers score the earlier ones.
    opener = ThreadPoolExecutor(1, thread_name_prefix="bpuemu-open")

    def add(calib: Calibration) -> _Scoring:
        scorings.append(_Scoring(len(scorings), calib, activation_params(plan, calib, cache), weights, evaluator, opener))
        return scorings[-1]

    def best_line(cands: Sequence[_Scoring]) -> str:
        top = max(cands, key=lambda c: (c.bound(), -c.index))
        return f"{'' if top.exact else '<= '}{top.bound():.6f}"

    *step1, step2, step3 = calibs
    log.info("default calibration search, step 1: max, max-percentile %g, kl", percentile)
    with opener:
        for calib in step1:
            add(calib)
        if not _reaches(scorings, target):
            log.info("step 1 best cosine %s < %.3f; step 2: max-percentile %g with perchannel featuremap calibration",
                     best_line(scorings), target, percentile)
            add(step2)
            if not _reaches(scorings, target):
                # "the method corresponding to the highest cosine similarity in Step2": step 2 has one candidate.
                log.info("step 2 best cosine %s < %.3f; step 3: %s with asymmetric quantization", best_line(scorings), target,
                         step2.name)
                add(step3)
        winner = _winner(scorings)
        for c in scorings:          # the sessions of candidates left before their last sample
            c._session = None
    for c in scorings:
        _log_scoring(log, c, evaluator)
    calib = winner.calib
    log_selection(log, calib.method.name, calib.per_channel, calib.asymmetric)
    return SearchResult(winner.acts, calib.method.name, calib.per_channel, calib.asymmetric,
                        [c.candidate() for c in scorings], {})


def _exhaustive_default_search(plan: QuantPlan, cache: ThresholdCache, weights, evaluator: Evaluator, target: float,
                               percentile: float, log: logging.Logger) -> SearchResult:
    """The default search with every candidate scored on every evaluation sample (the reference
    ``default_search`` must choose as)."""
    candidates: List[Candidate] = []
    tried: List[Tuple[Candidate, Calibration, Dict[str, TensorQuant]]] = []

    def run(calib: Calibration):
        acts = activation_params(plan, calib, cache)
        tried.append((_try(calib.name, acts, weights, evaluator, log, candidates), calib, acts))

    def best():
        return max(tried, key=lambda x: x[0].cosine)  # first of equals wins: earlier steps are preferred

    *step1, step2, step3 = default_candidates(percentile)
    log.info("default calibration search, step 1: max, max-percentile %g, kl", percentile)
    for calib in step1:
        run(calib)
    if best()[0].cosine < target:
        log.info("step 1 best cosine %.6f < %.3f; step 2: max-percentile %g with perchannel featuremap calibration",
                 best()[0].cosine, target, percentile)
        run(step2)
        if best()[0].cosine < target:
            log.info("step 2 best cosine %.6f < %.3f; step 3: %s with asymmetric quantization", best()[0].cosine, target, step2.name)
            run(step3)
    cand, calib, acts = best()
    log_selection(log, calib.method.name, calib.per_channel, calib.asymmetric)
    return SearchResult(acts, calib.method.name, calib.per_channel, calib.asymmetric, candidates, {})


def uniform(plan: QuantPlan, cache: ThresholdCache, calib: Calibration, log: logging.Logger) -> SearchResult:
    log.info("calibration method: %s", calib.name)
    return SearchResult(activation_params(plan, calib, cache), calib.method.name, calib.per_channel, calib.asymmetric, [], {})


# --- node sensitivity ---------------------------------------------------------------------------

def sensitivity_of_nodes(
    calibrated: onnx.ModelProto,
    samples: Sequence[Mapping[str, np.ndarray]],
    node_type: str = "node",
    interested_nodes: Optional[Sequence[str]] = None,
    reference: Optional[Sequence[Sequence[np.ndarray]]] = None,
) -> Dict[str, float]:
    """Output cosine similarity with only one thing quantized, the rest float.

    ``node_type`` "node": each ordinary node with its input calibration nodes
    (activations and weights) enabled; "activation"/"weight": each calibration
    node of that kind alone. Sorted from most to least sensitive.
    """
    calib = calibration_nodes(calibrated)
    feeds = {n.output[0]: n for n in calib}
    kind = {n.name: next((a.s.decode() for a in n.attribute if a.name == "kind"), "") for n in calib}
    if node_type == "node":
        groups = {}
        for n in calibrated.graph.node:
            if n.op_type == "HzCalibration":
                continue
            enabled = [feeds[i].name for i in n.input if i in feeds]
            if enabled:
                groups[n.name] = enabled
    elif node_type in ("activation", "weight"):
        groups = {n.name: [n.name] for n in calib if kind[n.name] == node_type}
    else:
        raise ValueError(f"node_type must be node, activation or weight, not {node_type!r}")
    if interested_nodes is not None:
        groups = {k: v for k, v in groups.items() if k in set(interested_nodes)}
    names = [o.name for o in calibrated.graph.output]
    if reference is None:
        reference = scored_outputs(calibrated_to_fakequant(calibrated, enabled=()), samples)[1]
    out = {}
    for name, enabled in groups.items():
        per_output = output_cosines(reference, scored_outputs(calibrated_to_fakequant(calibrated, enabled), samples)[1], names)
        out[name] = min(per_output.values())
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def mix_search(plan: QuantPlan, cache: ThresholdCache, weights, evaluator: Evaluator, options, log: logging.Logger) -> SearchResult:
    per_channel, asym = options.per_channel, options.asymmetric
    methods: List[Method] = [KL, MAX, percentile_method(options.search_percentile)]
    candidates: List[Candidate] = []
    uniform_results: List[Tuple[Candidate, Method, Dict[str, TensorQuant]]] = []
    log.info("mix calibration search: uniform kl, max, max-percentile %g", options.search_percentile)
    for m in methods:
        acts = activation_params(plan, Calibration(m, per_channel, asym), cache)
        uniform_results.append((_try(Calibration(m, per_channel, asym).name, acts, weights, evaluator, log, candidates), m, acts))
    base_cand, base_method, base_acts = max(uniform_results, key=lambda x: x[0].cosine)

    # Step 1: sensitive nodes, measured on the calibrated model of the best uniform method.
    calibrated = emit_calibrated(plan, base_acts, weights)
    k = options.mix_sensitivity_samples or len(evaluator.samples)
    sens = sensitivity_of_nodes(calibrated, evaluator.samples[:k], "node",
                                interested_nodes=[n for n in plan.node_activation_inputs], reference=evaluator.reference[:k])
    sensitive = [n for n, c in sens.items() if c < SENSITIVE_BELOW][: options.mix_sensitive_nodes]
    log.info("mix: %d quantization-sensitive node(s): %s", len(sensitive),
             ", ".join(f"{n} ({sens[n]:.6f})" for n in sensitive) or "none")

    # Step 2: per sensitive node, the best method for its input activations.
    assignment = {g.id: Calibration(base_method, per_channel, asym) for g in plan.groups}
    current = base_cand.cosine
    node_methods: Dict[str, str] = {}
    for node in sensitive:
        gids = {plan.activations[t].group for t in plan.node_activation_inputs.get(node, []) if not plan.group_of(t).fixed}
        if not gids:
            continue
        best_m = assignment[next(iter(gids))].method
        for m in methods:
            if all(assignment[g].method == m for g in gids):
                continue
            trial = dict(assignment)
            for g in gids:
                trial[g] = Calibration(m, per_channel, asym)
            cos, _ = evaluator.score(activation_params(plan, trial, cache), weights)
            if cos > current:
                current, best_m, assignment = cos, m, trial
        node_methods[node] = best_m.name
        log.info("mix: node %s uses %s", node, best_m.name)
    mix_acts = activation_params(plan, assignment, cache)
    mix_cand = _try("mix", mix_acts, weights, evaluator, log, candidates)

    # Step 3: Mix against the uniform methods.
    if mix_cand.cosine > base_cand.cosine:
        log_selection(log, "mix", per_channel, asym)
        return SearchResult(mix_acts, "mix", per_channel, asym, candidates, node_methods)
    log_selection(log, base_method.name, per_channel, asym)
    return SearchResult(base_acts, base_method.name, per_channel, asym, candidates, {})


# --- bias correction ----------------------------------------------------------------------------

def bias_correction(plan: QuantPlan, acts, weights, samples, log: logging.Logger) -> Dict[str, np.ndarray]:
    """Empirical bias correction of the weight quantization error (Nagel et al., data-free
    quantization, with measured input means): for each BPU Conv/Gemm with int8
    weights, the mean error its quantized weights add to output channel c is
    sum((W - W_q)[c] * E[x]) -- linear in the input, so the input's per-channel
    mean (measured on the quantized model, as the layer will see it) gives it
    exactly, up to zero-padding borders. The bias absorbs it.

    Each layer is corrected for its own error only: correcting every layer by
    the error measured at its output would count upstream errors many times
    over. ConvTranspose (strided output) is left alone.
    """
    from bpuemu.host.quant.emit import bias_values

    sites = {n: b for n, b in plan.biases.items() if b.activation in acts and b.weight in weights}
    idx = GraphIndex(plan.model)
    sites = {n: b for n, b in sites.items() if idx.by_name[n].op_type in ("Conv", "Gemm")
             and not (idx.by_name[n].op_type == "Gemm" and _attr_int(idx.by_name[n], "transA", 0))}
    if not sites or not samples:
        return {}
    qmodel = emit_quantized(plan, acts, weights)
    qidx = GraphIndex(qmodel)
    inputs = {n: qidx.by_name[n].input[0] for n in sites}      # the dequantized input each layer reads
    names = list(dict.fromkeys(inputs.values()))
    sess = open_session(with_outputs(qmodel, names))
    sums: Dict[str, np.ndarray] = {}
    for s in samples:
        for name, v in zip(names, sess.run(names, feed_for(sess, s))):
            m = np.moveaxis(v.astype(np.float64), 1, 0).reshape(v.shape[1], -1).mean(axis=1)
            sums[name] = sums[name] + m if name in sums else m
    out = {}
    for n, site in sites.items():
        node = idx.by_name[n]
        mean_x = sums[inputs[n]] / len(samples)
        w = idx.const(site.weight).astype(np.float64)
        dw = w - weights[site.weight].dequantized().astype(np.float64)
        if node.op_type == "Conv":
            group = _attr_int(node, "group", 1)
            cout, cin_g = dw.shape[0], dw.shape[1]
            dsum = dw.reshape(cout, cin_g, -1).sum(axis=2)
            x = mean_x.reshape(group, cin_g)[np.arange(cout) // (cout // group)]
            corr = np.sum(dsum * x, axis=1)
        else:
            alpha = float(next((a.f for a in node.attribute if a.name == "alpha"), 1.0))
            corr = alpha * (dw @ mean_x if _attr_int(node, "transB", 0) else mean_x @ dw)
        b = bias_values(plan, n, {})
        base = b.astype(np.float64) if b is not None else np.zeros(site.channels)
        if corr.shape != base.shape:
            continue
        out[n] = (base + corr).astype(np.float32)
    log.info("bias correction: adjusted the bias of %d node(s)", len(out))
    return out


def _attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    return int(next((a.i for a in node.attribute if a.name == name), default))
