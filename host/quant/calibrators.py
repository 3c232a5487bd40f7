"""Calibration methods: statistics -> thresholds -> activation quantization parameters.

Threshold methods live in a registry keyed by name (``THRESHOLD_METHODS``):

* ``max``: threshold = max |x|; with a percentile p < 1 ("max-percentile p"),
  the p-quantile of |x| over all calibration values (from the histogram,
  linearly interpolated inside the bin);
* ``kl``: TensorRT's entropy calibration: over the |x| histogram (2048 bins),
  for every candidate cut i >= 128 bins, the KL divergence between the
  reference distribution (bins below i, outliers folded into bin i-1) and its
  128-level quantized version; the threshold is the upper edge of the best
  cut. Same arithmetic as onnxruntime's entropy calibrator (its smoothing),
  with NVIDIA's treatment of the zero bin (it takes bin 1's count, so a
  ReLU's spike of zeros does not decide the cut). A tensor with fewer values
  than bins (a pooled vector, a few logits) gets max: its histogram is noise.

A ``Calibration`` combines a method with per-channel featuremap calibration
and asymmetric quantization:

* per-channel (axis 1): threshold_c = min(method threshold of the tensor,
  max |x| of channel c) -- the tensor-level method clips outliers, each
  channel gets no more range than it uses;
* asymmetric: the range [max(min, -T), min(max, T)] (widened to hold 0) over
  all 255 levels, T being the method's threshold (so asymmetric max is plain
  min/max);
* symmetric int8: scale = T / 127, zero point 0 (int16: T / 32767).

All members of a scale group get one set of parameters, from the largest
threshold (the widest range) of the group's sources.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Tuple, Union

import numpy as np

from bpuemu.host.quant.marking import Group, QuantPlan
from bpuemu.host.quant.params import MIN_THRESHOLD, TensorQuant, asymmetric, fixed_int8_input, symmetric
from bpuemu.host.quant.statistics import TensorStats


@dataclass(frozen=True)
class Method:
    kind: str                 # a key of THRESHOLD_METHODS
    percentile: float = 1.0

    @property
    def name(self) -> str:
        if self.kind == "max" and self.percentile < 1.0:
            return f"max-percentile {self.percentile:g}"
        return self.kind


MAX = Method("max")
KL = Method("kl")


def percentile_method(p: float) -> Method:
    return Method("max", p)


@dataclass(frozen=True)
class Calibration:
    """One way to calibrate every activation: a method, per-channel or not, asymmetric or not."""

    method: Method
    per_channel: bool = False
    asymmetric: bool = False

    @property
    def name(self) -> str:
        parts = [self.method.name]
        if self.per_channel:
            parts.append("perchannel")
        if self.asymmetric:
            parts.append("asymmetric")
        return " + ".join(parts)


# --- threshold methods -------------------------------------------------------------------------

def max_threshold(stats: TensorStats, percentile: float = 1.0, **_) -> float:
    if percentile >= 1.0 or stats.absmax == 0:
        return stats.absmax
    hist = stats.hist.astype(np.float64)
    cum = np.cumsum(hist)
    target = percentile * cum[-1]
    b = int(np.searchsorted(cum, target))
    b = min(b, len(hist) - 1)
    prev = cum[b - 1] if b > 0 else 0.0
    frac = (target - prev) / hist[b] if hist[b] > 0 else 1.0
    return float(min((b + frac) * stats.bin_width, stats.absmax))


def _smooth(p: np.ndarray, eps: float = 0.0001) -> Optional[np.ndarray]:
    """onnxruntime's smooth_distribution: move eps mass onto the empty bins."""
    is_zero = p == 0
    n_zero = int(is_zero.sum())
    n_nonzero = p.size - n_zero
    if n_nonzero == 0:
        return None
    eps1 = eps * n_zero / n_nonzero
    return p.astype(np.float64) + eps * is_zero - eps1 * ~is_zero


def _entropy(p: np.ndarray, q: np.ndarray) -> float:
    p = p / p.sum()
    q = q / q.sum()
    mask = p > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def kl_prefix_sums(h: np.ndarray):
    """Prefix sums over the bins of an int64 histogram (each with a leading 0): counts, non-empty bins,
    count x log count and log count (0 for empty bins)."""
    pos = h > 0
    logh = np.zeros(h.size)
    logh[pos] = np.log(h[pos])
    return (np.concatenate([[0], np.cumsum(h)]), np.concatenate([[0], np.cumsum(pos)]),
            np.concatenate([[0.0], np.cumsum(h * logh)]), np.concatenate([[0.0], np.cumsum(logh)]))


def kl_divergences(hist: np.ndarray, quantized_bins: int = 128, eps: float = 0.0001) -> np.ndarray:
    """KL divergence of every cut i in [quantized_bins, len(hist)], all cuts at once.

    The arithmetic of onnxruntime's entropy calibrator (reference P: bins below
    i with the outliers added to bin i-1; candidate Q: bins below i merged into
    ``quantized_bins`` groups by integer division, spread over the non-empty
    bins; both smoothed by eps), rewritten with prefix sums so that all cuts
    cost O(cuts x quantized_bins). The smoothing enters p * log(p) only to first
    order in eps (its effect there is O(eps^2), far below the differences
    between cuts).

    Q's groups but the last depend only on m = i // quantized_bins, which the
    ``quantized_bins`` cuts of one m share: their counts, non-empty bins and
    per-bin values are computed once per m (16 rows for 2048 bins) and repeated,
    and only the last group (up to i) per cut; the arrays then summed are the
    same, element for element, as gathering every cut's groups (as before: 2.2x
    the time, ~190 of the ~8 ms a tensor; tests/host/test_quant.py compares both).
    """
    h = np.asarray(hist, dtype=np.int64)
    n = h.size
    qb = quantized_bins
    I = np.arange(qb, n + 1)
    if I.size == 0:
        return np.empty(0)
    total = int(h.sum())
    C, NZ, L1, L0 = kl_prefix_sums(h)

    m = I // qb
    ms = np.arange(m[0], m[-1] + 1)
    g = m - ms[0]                                     # each cut's row of the per-m arrays
    starts = ms[:, None] * np.arange(qb)[None, :]     # group k of Q starts at bin m * k
    Cs, NZs = C[starts], NZ[starts]
    sums_in, nnz_in = Cs[:, 1:] - Cs[:, :-1], NZs[:, 1:] - NZs[:, :-1]
    per_in = np.where(nnz_in > 0, sums_in // np.maximum(nnz_in, 1), 0)

    last_start = m * (qb - 1)                         # the last group: bins m * (qb - 1) to i - 1
    outliers = total - C[I]
    sums_last = C[I] - C[last_start]                  # Q's groups hold the bins below i only
    last_raw = h[I - 1]
    last_p = last_raw + outliers                      # bin i-1 of P
    nnz_last = NZ[I] - NZ[last_start] + ((last_raw == 0) & (last_p > 0)).astype(np.int64)
    per_last = np.where(nnz_last > 0, sums_last // np.maximum(nnz_last, 1), 0)

    nnz = np.empty((I.size, qb), np.int64)
    per_bin = np.empty((I.size, qb), np.int64)
    group_p = np.empty((I.size, qb))
    nnz[:, :-1], nnz[:, -1] = nnz_in[g], nnz_last
    per_bin[:, :-1], per_bin[:, -1] = per_in[g], per_last
    group_p[:, :-1], group_p[:, -1] = sums_in[g], sums_last

    nnz_p = NZ[I - 1] + (last_p > 0)
    zeros_p = I - nnz_p
    with np.errstate(divide="ignore", invalid="ignore"):
        e_p = eps * zeros_p / nnz_p
        # A group below the last with no value has no non-empty bin either (a non-empty bin holds >= 1):
        # only the last group, given bin i-1's outliers, can be empty-valued with a non-empty bin.
        zeros_q = zeros_p + np.where(per_last == 0, nnz_last, 0)
        nnz_q = I - zeros_q
        e_q = eps * zeros_q / np.maximum(nnz_q, 1)
        # sum over bins with p > 0 of p' log p', bins below i-1 to first order in eps
        a = L1[I - 1] - e_p * (L0[I - 1] + NZ[I - 1])
        lp = last_p - e_p
        a = a + np.where(last_p > 0, lp * np.log(np.where(last_p > 0, lp, 1.0)), 0.0)
        # sum over bins with p > 0 of p' log q' (q' is one value per group)
        group_p[:, -1] += outliers
        qv = np.where(per_bin > 0, per_bin - e_q[:, None], eps)
        x = np.sum((group_p - e_p[:, None] * nnz) * np.log(qv), axis=1)
        sq = (np.sum(per_in * nnz_in, axis=1)[g] + per_last * nnz_last).astype(np.float64)
        kl = (a - x) / total + np.log(sq) - np.log(total)
    kl[(nnz_q <= 0) | (nnz_p <= 0) | ~np.isfinite(kl)] = np.inf
    return kl


def kl_threshold(stats: TensorStats, quantized_bins: int = 128, **_) -> float:
    """TensorRT-style entropy calibration; max when the histogram is too sparse to judge."""
    hist = stats.hist
    if stats.absmax == 0 or hist.sum() == 0:
        return stats.absmax
    if stats.count < len(hist):
        # Fewer values than bins (a pooled vector, logits of a few samples): KL would cut at noise.
        return stats.absmax
    # As NVIDIA's entropy calibrator does: bin 0 takes bin 1's count, so the spike of exact
    # zeros after a ReLU does not push the cut down to keep that spike in a group of its own.
    hist = hist.copy()
    hist[0] = hist[1]
    kl = kl_divergences(hist, quantized_bins)
    if not np.any(np.isfinite(kl)):
        return stats.absmax
    best = int(np.argmin(kl)) + quantized_bins
    return float(best * stats.bin_width)


def needs_histogram(method: Method) -> bool:
    """Whether ``method`` reads the |x| histogram (max alone needs only the range)."""
    return not (method.kind == "max" and method.percentile >= 1.0)


ThresholdFn = Callable[..., float]
THRESHOLD_METHODS: Dict[str, ThresholdFn] = {
    "max": max_threshold,
    "kl": kl_threshold,
}


class ThresholdCache:
    """Threshold of each (tensor, method), computed once per calibration run (KL is the slow one)."""

    def __init__(self, stats: Mapping[str, TensorStats], quantized_bins: int = 128,
                 known_kl: Optional[Mapping[str, float]] = None):
        """``known_kl``: KL thresholds (tensor -> threshold) already computed from these statistics
        with these quantized_bins (the calibration statistics cache keeps them)."""
        self.stats = stats
        self.quantized_bins = quantized_bins
        self._cache: Dict[Tuple[str, Method], float] = {(t, KL): v for t, v in (known_kl or {}).items()}

    def kl_thresholds(self) -> Dict[str, float]:
        """The KL thresholds known or computed so far, by tensor."""
        return {t: v for (t, m), v in self._cache.items() if m == KL}

    def threshold(self, tensor: str, method: Method) -> float:
        key = (tensor, method)
        if key not in self._cache:
            if needs_histogram(method) and self.stats[tensor].hist is None:
                raise ValueError(f"{method.name} needs histograms, and the statistics were collected without them")
            fn = THRESHOLD_METHODS[method.kind]
            self._cache[key] = fn(self.stats[tensor], percentile=method.percentile, quantized_bins=self.quantized_bins)
        return self._cache[key]


# --- thresholds -> parameters -------------------------------------------------------------------

def group_params(plan: QuantPlan, group: Group, calib: Calibration, cache: ThresholdCache) -> Dict[str, TensorQuant]:
    """Parameters of every member of ``group`` under ``calib``."""
    if group.fixed:
        return {t: fixed_int8_input(t) for t in group.members}
    sources = [t for t in group.sources if t in cache.stats]
    name = calib.method.name
    if not sources:  # never seen during calibration (e.g. a dead branch)
        return {t: symmetric(t, MIN_THRESHOLD, group.dtype, name) for t in group.members}
    T = max(cache.threshold(t, calib.method) for t in sources)
    lo = min(cache.stats[t].min for t in sources)
    hi = max(cache.stats[t].max for t in sources)
    axis = None
    if calib.per_channel and group.channels:
        chans = [cache.stats[t] for t in sources]
        if all(s.channel_min is not None and s.channel_min.size == group.channels for s in chans):
            cabs = np.max([s.channel_absmax for s in chans], axis=0)
            lo = np.min([s.channel_min for s in chans], axis=0)
            hi = np.max([s.channel_max for s in chans], axis=0)
            T = np.minimum(T, cabs)
            axis = 1
    out = {}
    for t in group.members:
        if calib.asymmetric:
            out[t] = asymmetric(t, np.maximum(lo, -T), np.minimum(hi, T), group.dtype, name, axis)
        else:
            out[t] = symmetric(t, T, group.dtype, name, axis)
    return out


Assignment = Union[Calibration, Mapping[int, Calibration]]


def activation_params(plan: QuantPlan, assignment: Assignment, cache: ThresholdCache) -> Dict[str, TensorQuant]:
    """Parameters of every quantized activation; ``assignment`` is one Calibration or one per group id."""
    out: Dict[str, TensorQuant] = {}
    for g in plan.groups:
        calib = assignment if isinstance(assignment, Calibration) else assignment[g.id]
        out.update(group_params(plan, g, calib, cache))
    return {t: out[t] for t in plan.activations}
