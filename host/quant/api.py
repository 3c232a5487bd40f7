"""calibrate / build_calibrated_model / build_quantized_model / node_cosines.

``calibrate`` runs one calibration strategy from a registry keyed by
calibration_type (default, mix, kl, max, skip, load) over statistics collected
once; the build functions then rewrite the model in one pass each.
"""
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set

import numpy as np
import onnx

from bpuemu.common.compare import agreement_rate, is_integer
from bpuemu.common.compare import cosine_similarity as cosine
from bpuemu.common.errors import InvalidInput
from bpuemu.common.numerics import dequantize
from bpuemu.host.quant import search
from bpuemu.host.quant.calibrators import (
    MAX, Calibration, Method, ThresholdCache, group_params, needs_histogram, percentile_method,
)
from bpuemu.host.quant.emit import emit_calibrated, emit_quantized
from bpuemu.host.onnxgraph import (
    DQ, Q, GraphIndex, Parts, constants_to_initializers, convert_opset, default_opset, feed_for, graph_inputs, has_qdq,
    name_nodes, open_parted, sample_workers, tensor_infos, with_outputs,
)
from bpuemu.host.onnxgraph.parts import tensor_bytes
from bpuemu.host.quant.graph import (
    INT16_OPSET, MIN_OPSET, LoadedQuant, LoadedWeight, float_outputs, prepare_model, strip_qdq,
)
from bpuemu.host.quant.marking import QuantPlan, build_plan
from bpuemu.host.quant.options import Int16Spec, QuantOptions
from bpuemu.host.quant.params import (
    INT_RANGE, QuantParams, TensorQuant, WeightQuant, asymmetric, fixed_int8_input, quantize_weight, symmetric,
)
from bpuemu.host.quant.stages import StageClock
from bpuemu.host.quant.statcache import cached_statistics
from bpuemu.host.compiler.optable import BPU_OPS

LOG = logging.getLogger("bpuemu.host.quant")
Sample = Mapping[str, np.ndarray]


def _quiet() -> logging.Logger:
    lg = logging.Logger("bpuemu.host.quant.quiet")
    lg.setLevel(logging.CRITICAL + 1)
    return lg


def qdq_wrapped_nodes(model: onnx.ModelProto) -> Set[str]:
    """Nodes of a QDQ model that live in the integer domain (their float inputs come
    from DequantizeLinear, their outputs go only to QuantizeLinear) and that the
    BPU supports: what a QAT model says runs on the BPU."""
    idx = GraphIndex(model)
    out = set()
    for n in idx.nodes:
        if n.op_type in (Q, DQ) or n.op_type not in BPU_OPS:
            continue
        ins = [i for i in n.input if i and i not in idx.inits]
        if not ins or not all(idx.producer.get(i) is not None and idx.producer[i].op_type == DQ for i in ins):
            continue
        if all(c.op_type == Q for o in n.output if o for c, _ in idx.consumers.get(o, [])) and \
                not any(o in idx.outputs for o in n.output):
            out.add(n.name)
    return out


def _prepare(model: onnx.ModelProto, options: QuantOptions):
    """The normalized float model (and, for load, the parameters read from the QDQ model)."""
    loaded: Dict[str, LoadedQuant] = {}
    loaded_w: Dict[str, LoadedWeight] = {}
    wrapped: Set[str] = set()
    if has_qdq(model):
        if options.calibration_type != "load":
            raise InvalidInput("the model already holds QuantizeLinear/DequantizeLinear nodes",
                               hint="a QAT model is converted with calibration_type: load")
        named = onnx.ModelProto.FromString(model.SerializeToString())
        name_nodes(named)
        wrapped = qdq_wrapped_nodes(named)
        model, loaded, loaded_w = strip_qdq(named)
    elif options.calibration_type == "load":
        raise InvalidInput("calibration_type load needs a quantized (QDQ) model, as exported by QAT",
                           hint="this model has no QuantizeLinear/DequantizeLinear nodes; use default, kl or max")
    return prepare_model(model, MIN_OPSET), loaded, loaded_w, wrapped


def _same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, samples: Sequence[Sample]) -> bool:
    if not samples:
        return True
    try:
        ra, rb = float_outputs(a, samples[:1]), float_outputs(b, samples[:1])
    except InvalidInput:
        return False
    # onnxruntime's float kernels/fusions may differ by an ULP between opsets: compare with a tolerance.
    return all(x.shape == y.shape and np.allclose(x, y, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(x).max(initial=0))))
               for x, y in zip(ra[0], rb[0]))


def _plan(model, bpu_nodes, int8_inputs, options, samples, log) -> QuantPlan:
    """Build the plan; when int16 was asked for and the model's opset cannot hold it,
    convert to opset 21 (checked to give the same float outputs) or fall back to int8."""
    plan = build_plan(model, bpu_nodes, int8_inputs, options, log)
    wanted = [g for g in plan.groups if g.int16_requests]
    if not wanted:
        return plan
    if default_opset(plan.model) < INT16_OPSET:
        try:
            converted = convert_opset(plan.model, INT16_OPSET)
            constants_to_initializers(converted)
            name_nodes(converted)
            ok = _same_outputs(plan.model, converted, samples)
        except InvalidInput as exc:
            ok, converted = False, None
            log.debug("opset conversion failed: %s", exc)
        if not ok:
            log.info("int16 needs opset %d (QuantizeLinear int16) and the model does not convert from opset %d "
                     "with the same outputs; int16 falls back to int8", INT16_OPSET, default_opset(plan.model))
            return plan
        log.info("opset %d -> %d for int16 quantization", default_opset(plan.model), INT16_OPSET)
        plan = build_plan(converted, bpu_nodes, int8_inputs, options, _quiet())
    for g in plan.groups:
        if g.int16_requests:
            g.dtype = "int16"
    log.info("int16 quantization on %d tensor(s): %s", sum(len(g.members) for g in plan.groups if g.dtype == "int16"),
             ", ".join(t for g in plan.groups if g.dtype == "int16" for t in g.members))
    return plan


def random_samples(model: onnx.ModelProto, int8_inputs: Sequence[str], count: int, seed: int) -> List[Dict[str, np.ndarray]]:
    """Calibration data for ``skip``: X_128 images uniform in [-128, 127], featuremaps standard normal."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(max(1, count)):
        sample = {}
        for vi in graph_inputs(model):
            shape = [d.dim_value if d.dim_value > 0 else 1 for d in vi.type.tensor_type.shape.dim]
            if vi.name in int8_inputs:
                sample[vi.name] = rng.integers(-128, 128, shape).astype(np.float32)
            else:
                sample[vi.name] = rng.standard_normal(shape).astype(np.float32)
        out.append(sample)
    return out


def _weights(plan: QuantPlan) -> Dict[str, WeightQuant]:
    idx = GraphIndex(plan.model)
    return {w: quantize_weight(w, idx.const(w), site.axis) for w, site in plan.weights.items()}


def _stats_cache(plan: QuantPlan, samples: Sequence[Sample], options: QuantOptions,
                 methods: Sequence[Calibration], log: logging.Logger, used: Optional[List] = None,
                 clock: Optional[StageClock] = None) -> ThresholdCache:
    """Statistics for the calibrations ``methods``: the histogram pass only when one of
    them reads histograms, per-channel ranges only when one is per-channel; read from the
    calibration statistics cache (statcache.py) when this model saw these samples before,
    with the KL thresholds computed from them then. ``used`` collects (entry, thresholds)
    for ``calibrate`` to add this run's KL thresholds to the entry; ``clock`` times it as the
    "statistics" stage."""
    q = options.kl_quantized_bins
    with (clock or StageClock()).stage("statistics"):
        cached = cached_statistics(plan.model, plan.stat_tensors(), samples, plan.infos, options.histogram_bins,
                                   histograms=any(needs_histogram(c.method) for c in methods),
                                   per_channel=any(c.per_channel for c in methods), log=log)
    cache = ThresholdCache(cached.stats, q, {t: v for (t, qb), v in cached.kl.items() if qb == q})
    if used is not None:
        used.append((cached, cache))
    return cache


# --- calibration strategies, keyed by calibration_type ---------------------------------------------

class _Context:
    def __init__(self, plan, samples, options, log, loaded, loaded_w, clock: StageClock):
        self.plan, self.samples, self.options, self.log = plan, samples, options, log
        self.loaded, self.loaded_w = loaded, loaded_w
        self.clock = clock
        self.statistics: List = []     # (statcache entry, ThresholdCache) of each statistics read

    def eval_samples(self) -> List[Sample]:
        n = self.options.search_samples
        return list(self.samples[:n]) if n else list(self.samples)

    def hold_out_search_samples(self, search: str) -> List[Sample]:
        """The samples the ``search`` scores its candidates on, logged: with at least search_held_out_from
        calibration samples, the last search_samples of them, taken out of ``self.samples`` (what the
        statistics and bias correction see); with fewer, the first search_samples, calibrated on too."""
        o, total = self.options, len(self.samples)
        n = o.search_samples
        if o.search_held_out_from and n and total >= max(o.search_held_out_from, 2 * n):
            scored, self.samples = list(self.samples[total - n:]), list(self.samples[:total - n])
            self.log.info("%s search: scoring candidates on calibration samples %d-%d of %d, held out of the "
                          "calibration statistics (calibrated on samples 1-%d)", search, total - n + 1, total, total,
                          total - n)
            return scored
        scored = self.eval_samples()
        self.log.info("%s search: scoring candidates on calibration samples 1-%d of %d, which calibration also sees "
                      "(samples are held out from %d on)", search, len(scored), total, max(o.search_held_out_from, 2 * n))
        return scored


def _need_samples(ctx: _Context) -> None:
    if not ctx.samples:
        raise InvalidInput(f"calibration_type {ctx.options.calibration_type} needs calibration data",
                           hint="set cal_data_dir, or calibration_type: skip to try the model without data")


def _strategy_default(ctx: _Context):
    _need_samples(ctx)
    if ctx.options.per_channel:
        ctx.log.warning("per_channel is chosen by the default search itself; the per_channel setting is ignored")
    if ctx.options.max_percentile < 1.0:
        ctx.log.warning("max_percentile applies to calibration_type max only; ignored with default")
    scored = ctx.hold_out_search_samples("default")
    cache = _stats_cache(ctx.plan, ctx.samples, ctx.options, search.default_candidates(ctx.options.search_percentile), ctx.log,
                        ctx.statistics, ctx.clock)
    weights = _weights(ctx.plan)
    ev = search.Evaluator(ctx.plan, scored)
    res = search.default_search(ctx.plan, cache, weights, ev, ctx.options.search_target, ctx.options.search_percentile, ctx.log)
    return res, weights


def _strategy_mix(ctx: _Context):
    _need_samples(ctx)
    scored = ctx.hold_out_search_samples("mix")
    cache = _stats_cache(ctx.plan, ctx.samples, ctx.options, search.mix_candidates(ctx.options), ctx.log, ctx.statistics,
                        ctx.clock)
    weights = _weights(ctx.plan)
    ev = search.Evaluator(ctx.plan, scored)
    return search.mix_search(ctx.plan, cache, weights, ev, ctx.options, ctx.log), weights


def _uniform(method: Method):
    def strategy(ctx: _Context):
        _need_samples(ctx)
        o = ctx.options
        m = percentile_method(o.max_percentile) if method.kind == "max" else method
        calib = Calibration(m, o.per_channel, o.asymmetric)
        cache = _stats_cache(ctx.plan, ctx.samples, o, [calib], ctx.log, ctx.statistics, ctx.clock)
        return search.uniform(ctx.plan, cache, calib, ctx.log), _weights(ctx.plan)
    return strategy


def _strategy_skip(ctx: _Context):
    ctx.log.warning("calibration_type skip: calibrating with random data (max); the model cannot be used for accuracy checks")
    ctx.samples = random_samples(ctx.plan.model, ctx.plan.int8_inputs, ctx.options.skip_samples, ctx.options.seed)
    cache = _stats_cache(ctx.plan, ctx.samples, ctx.options, [Calibration(MAX)], ctx.log, clock=ctx.clock)
    res = search.uniform(ctx.plan, cache, Calibration(MAX), ctx.log)
    res.method = "skip"
    return res, _weights(ctx.plan)


def _as_int8(lq: LoadedQuant) -> LoadedQuant:
    """uint8 (onnxruntime's default activations) -> int8 with the same real values."""
    if lq.dtype == "uint8":
        return LoadedQuant(lq.scale, lq.zero_point.astype(np.int64) - 128, "int8", lq.axis)
    if lq.dtype == "uint16":
        return LoadedQuant(lq.scale, lq.zero_point.astype(np.int64) - 32768, "int16", lq.axis)
    return lq


def _loaded_tensor(t: str, lq: LoadedQuant) -> TensorQuant:
    lq = _as_int8(lq)
    qmin, qmax = INT_RANGE.get(lq.dtype, INT_RANGE["int8"])
    zp = lq.zero_point.astype(np.int64)
    scale = lq.scale.astype(np.float32)
    threshold = np.maximum(np.abs((qmin - zp) * scale), np.abs((qmax - zp) * scale)).astype(np.float32)
    return TensorQuant(t, lq.dtype if lq.dtype in INT_RANGE else "int8", scale, zp, threshold, "load", lq.axis)


def _strategy_load(ctx: _Context):
    plan, log = ctx.plan, ctx.log
    acts: Dict[str, TensorQuant] = {}
    missing = []
    for g in plan.groups:
        if g.fixed:
            acts.update({t: fixed_int8_input(t) for t in g.members})
            continue
        known = next((t for t in g.members if t in ctx.loaded), None)
        for t in g.members:
            src = t if t in ctx.loaded else known
            if src is None:
                missing.append(g)
                break
            q = _loaded_tensor(t, ctx.loaded[src])
            if q.dtype != g.dtype:  # int16 in the QAT model that this model cannot hold: same range in int8
                log.info("tensor %s was %s in the QAT model; it falls back to %s", t, q.dtype, g.dtype)
                if q.asymmetric and not q.per_channel:
                    qmin, qmax = INT_RANGE[q.dtype]
                    z, sc = float(q.zero_point), float(q.scale)
                    q = asymmetric(t, (qmin - z) * sc, (qmax - z) * sc, g.dtype, "load")
                else:
                    q = symmetric(t, q.threshold, g.dtype, "load", q.axis)
            acts[t] = q
    if missing:
        samples = ctx.samples or random_samples(plan.model, plan.int8_inputs, ctx.options.skip_samples, ctx.options.seed)
        log.warning("load: %d quantized tensor group(s) have no parameters in the QAT model (%s); calibrating them with max "
                    "on %s", len(missing), ", ".join(g.members[0] for g in missing),
                    "the calibration data" if ctx.samples else "random data")
        cache = _stats_cache(plan, samples, ctx.options, [Calibration(MAX)], log, clock=ctx.clock)
        for g in missing:
            acts.update(group_params(plan, g, Calibration(MAX), cache))
    idx = GraphIndex(plan.model)
    weights: Dict[str, WeightQuant] = {}
    for w, site in plan.weights.items():
        lw = ctx.loaded_w.get(w)
        value = idx.const(w)
        axis = site.axis % value.ndim
        if lw is not None and lw.quantized.dtype == np.int8 and not np.any(lw.zero_point) and \
                (lw.axis is None or lw.axis % value.ndim == axis):
            scale = np.broadcast_to(lw.scale.reshape(-1), (value.shape[axis],)).astype(np.float32) if lw.axis is None \
                else lw.scale.astype(np.float32)
            weights[w] = WeightQuant(w, axis, scale.copy(), lw.quantized.astype(np.int8), "load")
        else:
            weights[w] = quantize_weight(w, value, axis)
    acts = {t: acts[t] for t in plan.activations}
    log.info("calibration_type load: %d activation and %d weight parameter(s) read from the QAT model",
             sum(1 for q in acts.values() if q.method == "load"), sum(1 for q in weights.values() if q.method == "load"))
    return search.SearchResult(acts, "load", any(q.per_channel for q in acts.values()),
                               any(q.asymmetric for q in acts.values()), [], {}), weights


#: calibration_type -> strategy(context) -> (SearchResult, weights)
STRATEGIES: Dict[str, Callable] = {
    "default": _strategy_default,
    "mix": _strategy_mix,
    "kl": _uniform(Method("kl")),
    "max": _uniform(MAX),
    "skip": _strategy_skip,
    "load": _strategy_load,
}


def _node_methods(ctx: _Context, result) -> None:
    """quant_config's per op type / node calibration_type: the scale group of each such node's output
    is calibrated with that method instead of the strategy's."""
    plan, log = ctx.plan, ctx.log
    idx = GraphIndex(plan.model)
    wanted = {}
    for node, (kind, percentile) in ctx.options.node_methods.items():
        n = idx.by_name.get(node)
        out = n.output[0] if n is not None and n.output else ""
        if node not in plan.bpu_nodes or out not in plan.activations:
            log.info("quant_config: calibration_type %s of node %s does not apply: its output is not quantized "
                     "(it runs on the CPU, or it is the tail Conv's high-precision output)", kind, node)
            continue
        wanted[node] = (plan.group_of(out), Calibration(Method(kind, percentile)))
    if not wanted:
        return
    samples = ctx.samples or random_samples(plan.model, plan.int8_inputs, ctx.options.skip_samples, ctx.options.seed)
    cache = _stats_cache(plan, samples, ctx.options, [c for _, c in wanted.values()], log, clock=ctx.clock)
    for node, (group, calib) in wanted.items():
        if group.fixed:
            continue
        result.acts.update(group_params(plan, group, calib, cache))
        log.info("quant_config: node %s calibrated with %s (its output's scale group: %s)", node, calib.name,
                 ", ".join(group.members))


def calibrate(
    model: onnx.ModelProto,
    samples: Sequence[Sample],
    bpu_nodes: Set[str],
    int8_inputs: Sequence[str] = (),
    options: Optional[QuantOptions] = None,
    log: logging.Logger = LOG,
    clock: Optional[StageClock] = None,
) -> QuantParams:
    """Calibrate the BPU nodes of ``model`` (the optimized float model).

    ``samples``: calibration inputs by input name, float32 (X_128 values for
    ``int8_inputs``). ``bpu_nodes``: the placement's BPU nodes; every other
    node stays float. For calibration_type load, ``model`` is the QAT (QDQ)
    model and its integer-domain nodes count as BPU nodes too. ``clock``: times the
    "statistics" stage and the rest of the calibration as "search" (``stages``).
    """
    options = options or QuantOptions()
    samples = list(samples or [])
    base, loaded, loaded_w, wrapped = _prepare(model, options)
    int8_inputs = tuple(int8_inputs)
    bpu = set(bpu_nodes) | wrapped
    if options.calibration_type == "load":
        # Keep QAT int16 tensors int16 (when the opset allows).
        plan0 = build_plan(base, bpu, int8_inputs, options, _quiet())
        extra = dict(options.int16_nodes)
        for t, lq in loaded.items():
            if _as_int8(lq).dtype == "int16" and t in plan0.activations and plan0.activations[t].producer:
                extra[plan0.activations[t].producer] = Int16Spec(output=True)
        if len(extra) != len(options.int16_nodes):
            options = options.with_(int16_nodes=extra)
    plan = _plan(base, bpu, int8_inputs, options, samples, log)
    clock = clock or StageClock()
    ctx = _Context(plan, samples, options, log, loaded, loaded_w, clock)
    with clock.stage("search"):
        result, weights = STRATEGIES[options.calibration_type](ctx)
        if options.node_methods:
            _node_methods(ctx, result)
        for cached, cache in ctx.statistics:
            q = options.kl_quantized_bins
            cached.save_kl({(t, q): v for t, v in cache.kl_thresholds().items()}, log)
        corrections = {}
        if options.bias_correction:
            corrections = search.bias_correction(plan, result.acts, weights, ctx.samples, log)
    if options.model_output_type != "float":
        log.info("model outputs made by the BPU are %s (set_model_output_%s)", options.model_output_type, options.model_output_type)
    return QuantParams(
        activations=result.acts, weights=weights, method=result.method, plan=plan, options=options,
        per_channel=result.per_channel, asymmetric=result.asymmetric, candidates=result.candidates,
        bias_corrections=corrections, node_methods=result.node_methods,
    )


def _check_model(model: onnx.ModelProto, params: QuantParams) -> None:
    names = {n.name for n in params.plan.model.graph.node}
    given = onnx.ModelProto.FromString(model.SerializeToString())
    name_nodes(given)
    theirs = {n.name for n in given.graph.node if n.op_type not in ("Constant", Q, DQ)}
    if not theirs <= names:
        raise InvalidInput("the quantization parameters were calibrated on a different model "
                           f"(nodes {sorted(theirs - names)[:5]} are unknown to them)")


def build_quantized_model(model: onnx.ModelProto, params: QuantParams, int8_inputs: Sequence[str] = ()) -> onnx.ModelProto:
    """``*_quantized_model.onnx``: standard QDQ, int8 image inputs (see bpuemu.host.quant.emit)."""
    _check_model(model, params)
    if set(int8_inputs) != set(params.plan.int8_inputs):
        raise InvalidInput(f"int8 inputs {sorted(int8_inputs)} differ from the calibrated ones {sorted(params.plan.int8_inputs)}")
    return emit_quantized(params.plan, params.activations, params.weights, params.bias_corrections, params.options.model_output_type)


def build_calibrated_model(model: onnx.ModelProto, params: QuantParams) -> onnx.ModelProto:
    """``*_calibrated_model.onnx``: the float model with HzCalibration nodes."""
    _check_model(model, params)
    return emit_calibrated(params.plan, params.activations, params.weights, params.bias_corrections)


# --- similarity of the quantized model to the float model ------------------------------------------

def _dequantized_name(qidx: GraphIndex, tensor: str):
    """The tensor of the quantized model that holds ``tensor``'s (dequantized) value,
    and the Q node when it must be dequantized in numpy (int8 model output)."""
    qs = [c for c, _ in qidx.consumers.get(tensor, []) if c.op_type == Q]
    if not qs:
        return tensor, None
    q = qs[0]
    dqs = [c for c, _ in qidx.consumers.get(q.output[0], []) if c.op_type == DQ]
    if dqs:
        return dqs[0].output[0], None
    return q.output[0], q


def _dequantize(qidx: GraphIndex, q: onnx.NodeProto, x: np.ndarray) -> np.ndarray:
    zp = qidx.const(q.input[2]) if len(q.input) > 2 and q.input[2] else None
    return dequantize(x, qidx.const(q.input[1]), zp, next((a.i for a in q.attribute if a.name == "axis"), 1))


@dataclass
class Similarity:
    """How close the quantized model is to the float model, over some samples.

    ``nodes``: the "Cosine Similarity" column (see ``node_cosines``);
    ``outputs``: the cosine per float model output; ``agreements``: per integer
    output (ArgMax indices, labels), the fraction of equal elements, which
    replaces the meaningless cosine of indices; ``fused``: node -> the Relu/Clip
    whose output its row reports (see ``node_cosines``).
    """

    nodes: Dict[str, float]
    outputs: Dict[str, float]
    fused: Dict[str, str]
    agreements: Dict[str, float] = field(default_factory=dict)


def _q_params(qidx: GraphIndex, tensor: str) -> Optional[tuple]:
    """(scale, zero point) of the QuantizeLinear that quantizes ``tensor``, if one does."""
    q = next((c for c, _ in qidx.consumers.get(tensor, []) if c.op_type == Q), None)
    if q is None:
        return None
    scale = qidx.const(q.input[1])
    zp = qidx.const(q.input[2]) if len(q.input) > 2 and q.input[2] else np.zeros_like(scale, np.int64)
    return scale, zp.astype(np.int64)


def fused_activations(float_model: onnx.ModelProto, quantized_model: onnx.ModelProto) -> Dict[str, str]:
    """Node -> the Relu/Clip it is fused with in ``quantized_model``.

    A node is fused with a Relu/Clip when that activation is the only reader of
    its output and the quantized model quantizes both outputs with the same
    parameters: the node's output takes the activation's (non-negative) range,
    as the BPU computes the pair as one op (bpuemu.host.quant.marking).
    """
    from bpuemu.host.quant.marking import RELU_LIKE

    fidx, qidx = GraphIndex(float_model), GraphIndex(quantized_model)
    out = {}
    for n in fidx.nodes:
        if not n.output or n.output[0] in fidx.outputs or n.op_type in (Q, DQ):
            continue
        readers = fidx.consumers.get(n.output[0], [])
        if len(readers) != 1 or readers[0][0].op_type not in RELU_LIKE or readers[0][1] != 0:
            continue
        act = readers[0][0]
        qn, qa = qidx.by_name.get(n.name), qidx.by_name.get(act.name)
        if qn is None or qa is None or not qn.output or not qa.output:
            continue
        pn, pa = _q_params(qidx, qn.output[0]), _q_params(qidx, qa.output[0])
        if pn is not None and pa is not None and all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(pn, pa)):
            out[n.name] = act.name
    return out


def _part_values(runner, names: Sequence[str], sample: Sample):
    """The values of ``names`` for one sample, as ``{name: value}`` per part. A generator: each part runs
    in the ``next`` that asks for it, so a sample worker takes the float and the quantized model's parts
    in turn and drops each pair's tensors before the next parts run."""
    feed = feed_for(runner, sample)
    if isinstance(runner, Parts):
        yield from runner.iter_run(feed)
    else:
        yield dict(zip(names, runner.run(names, feed)))


#: Bytes of float tensors the cosine table compares (over all its samples) from which its node
#: cosines are compiled (``cosine_kernel``: about 3 ns a value less than numpy's einsum, and
#: importing numba costs 0.3-0.5 s): PP-OCRv4 det at 320x320 and up with 16 samples (1.5 GB at
#: 320, 6 GB at 640), not PP-OCR cls or the sample CNN.
COMPILED_FROM = 800 << 20


def _node_cosine(compared_bytes: int) -> Callable[[np.ndarray, np.ndarray], float]:
    """The cosine the table computes for ``compared_bytes`` of tensors: compiled from COMPILED_FROM on."""
    if compared_bytes < COMPILED_FROM:
        return cosine
    from bpuemu.host.quant.cosine_kernel import compiled_cosine

    return compiled_cosine


def similarity(
    float_model: onnx.ModelProto,
    quantized_model: onnx.ModelProto,
    samples: Sequence[Sample],
    nodes: Optional[Sequence[str]] = None,
) -> Similarity:
    """Node and output cosine similarities from one run of each model per sample
    (what makertbin reports; see ``node_cosines`` and ``output_cosines``)."""
    fm = prepare_model(float_model) if not has_qdq(float_model) else float_model
    qidx = GraphIndex(quantized_model)
    fused = fused_activations(fm, quantized_model)
    f_infos = tensor_infos(fm)
    pairs = _compared_pairs(GraphIndex(fm), qidx, fused, f_infos, nodes)
    if not samples:
        return Similarity({}, {}, fused)
    run = _PairedRun.open(fm, quantized_model, qidx, pairs, f_infos, len(samples))
    sums, ref, got = _summed_over_samples(run, samples)
    cosines, agreements = _output_similarity(ref, got, run.out_names)
    return Similarity({name: sums[(ft, qt)] / len(samples) for name, ft, qt, _ in pairs}, cosines, fused, agreements)


def _compared_pairs(fidx: GraphIndex, qidx: GraphIndex, fused: Mapping[str, str], f_infos, nodes):
    """Per float node the table shows (all, or ``nodes``): (its name, the float tensor it reports, the quantized
    model's tensor holding that value, the Q node to dequantize it with or None), float tensors only."""
    pairs = []
    for n in fidx.nodes:
        if nodes is not None and n.name not in nodes:
            continue
        shown = fidx.by_name[fused[n.name]] if n.name in fused else n   # a fused node reports its activation's output
        qn = qidx.by_name.get(shown.name)
        if qn is None or n.op_type in (Q, DQ) or not shown.output or not qn.output:
            continue
        target, qnode = _dequantized_name(qidx, qn.output[0])
        pairs.append((n.name, shown.output[0], target, qnode))
    return [p for p in pairs if p[1] in f_infos and f_infos[p[1]].is_float]


@dataclass
class _PairedRun:
    """The float and the quantized model opened with the compared tensors and the model outputs as outputs.

    Each sample runs part by part (onnxgraph.Parts: each model cut into pieces of about 2 MB of
    outputs): a part of each model, then the cosines of the pairs both have, then their tensors are
    dropped. On PP-OCRv4 det 640x640 a sample worker holds a part of each model's outputs instead of
    both models' every output (376 MB each)."""

    fs: object
    qs: object
    f_names: List[str]
    q_names: List[str]
    out_names: List[str]
    qidx: GraphIndex
    compared: Dict[tuple, Optional[onnx.NodeProto]]   # (float tensor, quantized tensor) -> its Q node or None
    node_cosine: Callable[[np.ndarray, np.ndarray], float]

    @classmethod
    def open(cls, fm: onnx.ModelProto, qm: onnx.ModelProto, qidx: GraphIndex, pairs, f_infos, n_samples: int):
        out_names = [o.name for o in fm.graph.output]
        q_infos = tensor_infos(qm)
        f_names = list(dict.fromkeys([p[1] for p in pairs] + out_names))
        q_names = list(dict.fromkeys([p[2] for p in pairs] + out_names))
        fs = open_parted(with_outputs(fm, f_names, f_infos), f_names, f_infos)
        qs = open_parted(with_outputs(qm, q_names, q_infos), q_names, q_infos)
        compared = {(ft, qt): qnode for _, ft, qt, qnode in pairs}   # a fused node and its activation share one
        node_cosine = _node_cosine(sum(tensor_bytes(f_infos.get(ft)) or 0 for ft, _ in compared) * n_samples)
        return cls(fs, qs, f_names, q_names, out_names, qidx, compared, node_cosine)

    def node_cosines(self, fv, qv, keys) -> List[float]:
        out = []
        for ft, qt in keys:
            qnode = self.compared[(ft, qt)]
            out.append(self.node_cosine(fv[ft], qv[qt] if qnode is None else _dequantize(self.qidx, qnode, qv[qt])))
        return out

    def one_sample(self, sample):
        """(per pair: its cosine, the float outputs, the quantized outputs dequantized) of one sample."""
        f_parts, q_parts = _part_values(self.fs, self.f_names, sample), _part_values(self.qs, self.q_names, sample)
        keep = set(self.out_names)
        fv: Dict[str, np.ndarray] = {}
        qv: Dict[str, np.ndarray] = {}
        left = list(self.compared)
        node_cos: Dict[tuple, float] = {}
        while True:
            f_part, q_part = next(f_parts, None), next(q_parts, None)
            if f_part is None and q_part is None:
                break
            fv.update(f_part or {})
            qv.update(q_part or {})
            ready = [k for k in left if k[0] in fv and k[1] in qv]
            node_cos.update(zip(ready, self.node_cosines(fv, qv, ready)))
            done = set(ready)
            left = [k for k in left if k not in done]
            f_need, q_need = {k[0] for k in left} | keep, {k[1] for k in left} | keep
            fv = {t: v for t, v in fv.items() if t in f_need}
            qv = {t: v for t, v in qv.items() if t in q_need}
        return node_cos, [fv[o] for o in self.out_names], self.dequantized_outputs(qv)

    def dequantized_outputs(self, qv) -> List[np.ndarray]:
        """The quantized model's outputs, those a Q node makes (int8 outputs) dequantized."""
        fixed = []
        for o in self.out_names:
            prod = self.qidx.producer.get(o)
            fixed.append(_dequantize(self.qidx, prod, qv[o]) if prod is not None and prod.op_type == Q else qv[o])
        return fixed


def _summed_over_samples(run: _PairedRun, samples: Sequence[Sample]):
    """Every sample on a sample worker of its own (two at once on two cores): per pair the sum of its
    cosines over the samples, added in sample order as one loop would; each sample's float and quantized outputs."""
    sums: Dict[tuple, float] = {k: 0.0 for k in run.compared}
    ref, got = [], []
    workers = min(sample_workers(), len(samples))
    with ThreadPoolExecutor(workers, thread_name_prefix="bpuemu-sample") if workers > 1 else nullcontext() as pool:
        for node_cos, reference, outputs in (pool.map(run.one_sample, samples) if pool is not None
                                             else map(run.one_sample, samples)):
            for k in run.compared:
                sums[k] += node_cos[k]
            ref.append(reference)
            got.append(outputs)
    return sums, ref, got


def _output_similarity(ref, got, out_names: Sequence[str]):
    """Per model output over the samples: the cosine of a float output, the agreement rate of an integer one."""
    integer = {k for k, o in enumerate(out_names) if is_integer(ref[0][k])}
    agreements = {o: float(np.mean([agreement_rate(r[k], g[k]) for r, g in zip(ref, got)]))
                  for k, o in enumerate(out_names) if k in integer}
    cosines = search.output_cosines(ref, got, out_names)
    return {o: c for o, c in cosines.items() if o not in agreements}, agreements


def node_cosines(
    float_model: onnx.ModelProto,
    quantized_model: onnx.ModelProto,
    samples: Sequence[Sample],
    int8_inputs: Sequence[str] = (),
    nodes: Optional[Sequence[str]] = None,
) -> Dict[str, float]:
    """Per node: the cosine similarity of its first output in the float model and the
    same node's (dequantized) output in the quantized model, averaged over samples.

    A node fused with the Relu/Clip that follows it (``fused_activations``: the
    activation is the only reader, and the node's output is quantized with the
    activation's non-negative range) reports the cosine at the activation's
    output, the value the BPU produces for the pair. Its own output is not
    meaningful on its own: the quantized tensor is clipped to the activation's
    range, so comparing it with the float output, negatives included, would
    show a low cosine (0.6 is typical) where nothing is lost.

    ``int8_inputs`` is accepted for symmetry with calibrate(); samples are cast
    to each model's input types anyway (X_128 floats -> int8).
    """
    return similarity(float_model, quantized_model, samples, nodes).nodes


def output_cosines(float_model: onnx.ModelProto, quantized_model: onnx.ModelProto, samples: Sequence[Sample]) -> Dict[str, float]:
    """Per float model output: the cosine similarity averaged over samples (int8 outputs
    dequantized); integer outputs (indices) are in ``similarity(...).agreements``."""
    return similarity(float_model, quantized_model, samples, nodes=()).outputs
