"""Compare metrics shared by hb_verifier and the accuracy tools (numpy only).

The figures hb_verifier prints for one pair of tensors (ptq_guide, "hb_verifier
Tool", Output Description), defined precisely here:

* ``digits`` (``-c``, default 5): values are compared as the tool prints them,
  with ``digits`` decimal places. Element ``i`` differs when
  ``round(a[i], digits) != round(b[i], digits)`` (numpy's round-half-even on
  float64). Integer tensors therefore compare exactly.
* ``lsb`` (``--lsb N``, optional): a differing element still counts as equal
  when ``|a[i] - b[i]| <= N * scale[i]``, where ``scale`` is the quantization
  step of the tensor (per tensor, or per channel along ``axis``). Integer
  tensors have a step of 1.
* mismatch result num = line_miss + line_diff + line_nan, where
  ``line_miss`` is the number of values one side has and the other lacks
  (``|a.size - b.size|``: the result counts differ), ``line_nan`` the number
  of positions where either side is NaN, and ``line_diff`` the number of other
  positions that differ (above);
* total result num = ``max(a.size, b.size)``; mismatch rate = mismatch / total;
* relative mismatch ratio = the largest ``|a - b| / max(|a|, |b|)`` over the
  differing positions (0 when none differ);
* max abs error = the largest ``|a - b|`` over the compared positions.

Tensors are compared element by element in C order over their common prefix,
the way the tool compares result files line by line. Cosine similarity, MSE and
the largest error in LSBs are reported alongside; for ``labels`` (a model's
integer outputs without a quantization scale: ArgMax indices, class ids) the
agreement rate (fraction of equal elements) replaces the cosine.

``METRICS`` holds the accuracy debugger's measures by the names users type
(``cosine-similarity``, ``mse``, ``mre``, ``sqnr``, ``chebyshev``), each with
the direction that is better.
"""
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

DEFAULT_DIGITS = 5
#: Slack (in quantization steps) for float rounding of dequantized values.
LSB_SLACK = 1e-3


def _flat_pair(a, b):
    a = np.asarray(a).reshape(-1)
    b = np.asarray(b).reshape(-1)
    n = min(a.size, b.size)
    return a[:n].astype(np.float64), b[:n].astype(np.float64)


def _sums(x: np.ndarray, y: np.ndarray):
    """x.x, y.y and x.y summed in float64. einsum, not np.dot/np.linalg.norm: BLAS threads fight
    onnxruntime's for the cores (up to 100x slower on a busy 2-core machine); it also sums in
    float64 without float64 copies."""
    return tuple(float(np.einsum("i,i->", u, v, dtype=np.float64)) for u, v in ((x, x), (y, y), (x, y)))


def cosine_similarity(a, b, sums: Optional[Callable] = None) -> float:
    """Cosine of the angle between two tensors (flattened, common prefix, NaNs skipped).

    1.0 when both are all zeros (they agree); 0.0 when exactly one is (by
    definition: no direction to compare, see DESIGN.md on blank inputs).
    ``sums(x, y)``: what computes x.x, y.y and x.y of the flattened tensors in float64
    (default: numpy's einsum; the host's cosine table passes a compiled one).
    """
    x, y = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
    n = min(x.size, y.size)
    x, y = x[:n], y[:n]
    sums = sums or _sums
    xx, yy, xy = sums(x, y)
    # A NaN in either tensor makes xx or yy NaN: only then look for the NaNs and sum without them
    # (the same sums as masking first, without the masks' passes over every pair of tensors).
    if (np.isnan(xx) or np.isnan(yy) or np.isnan(xy)) and (x.dtype.kind in "fc" or y.dtype.kind in "fc"):
        nan = np.isnan(x) | np.isnan(y)
        if nan.any():
            xx, yy, xy = sums(x[~nan], y[~nan])
    if xx == 0.0 and yy == 0.0:
        return 1.0
    if xx == 0.0 or yy == 0.0:
        return 0.0
    return float(np.clip(xy / (np.sqrt(xx) * np.sqrt(yy)), -1.0, 1.0))


def is_integer(a) -> bool:
    """Whether a tensor holds integers (or booleans): indices, labels, counts, raw quantized values."""
    return np.asarray(a).dtype.kind in "iub"


def agreement_rate(a, b) -> float:
    """The fraction of positions (flattened, C order) where two tensors hold equal values.

    The measure for integer outputs such as ArgMax indices, where a cosine of the
    numbers means nothing (index 3 is not "closer" to 4 than to 9). Values that
    one side lacks count as disagreeing; two empty tensors agree (1.0).
    """
    x, y = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
    total = max(x.size, y.size)
    if total == 0:
        return 1.0
    n = min(x.size, y.size)
    return float(np.count_nonzero(x[:n] == y[:n])) / total


def mse(a, b) -> float:
    x, y = _flat_pair(a, b)
    ok = ~(np.isnan(x) | np.isnan(y))
    return float(np.mean((x[ok] - y[ok]) ** 2)) if ok.any() else 0.0


def max_abs_error(a, b) -> float:
    x, y = _flat_pair(a, b)
    d = np.abs(x - y)
    d = d[~np.isnan(d)]
    return float(d.max()) if d.size else 0.0


def mre(a, b) -> float:
    """Mean relative error of ``b`` against the reference ``a``: sum|a - b| / sum|a|
    (0 when both are all zeros, inf when only the reference is)."""
    x, y = _flat_pair(a, b)
    ok = ~(np.isnan(x) | np.isnan(y))
    err, ref = float(np.abs(x[ok] - y[ok]).sum()), float(np.abs(x[ok]).sum())
    if ref == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / ref


#: SQNR reported for identical tensors (no noise): a finite ceiling, so tables and plots stay readable.
SQNR_IDENTICAL_DB = 200.0


def sqnr(a, b) -> float:
    """Signal-to-quantization-noise ratio in dB of ``b`` against the reference ``a``:
    10 log10(sum a^2 / sum (a - b)^2); ``SQNR_IDENTICAL_DB`` when they are equal."""
    x, y = _flat_pair(a, b)
    ok = ~(np.isnan(x) | np.isnan(y))
    signal, noise = float(np.square(x[ok]).sum()), float(np.square(x[ok] - y[ok]).sum())
    if noise == 0.0:
        return SQNR_IDENTICAL_DB
    if signal == 0.0:
        return -SQNR_IDENTICAL_DB
    return min(SQNR_IDENTICAL_DB, 10.0 * float(np.log10(signal / noise)))


def chebyshev(a, b) -> float:
    """Chebyshev distance: the largest |a - b| (NaNs skipped)."""
    return max_abs_error(a, b)


@dataclass(frozen=True)
class Metric:
    """A named error measure of a tensor against its reference, and which way is better."""

    name: str
    fn: object
    higher_is_better: bool

    def __call__(self, reference, value) -> float:
        return self.fn(reference, value)

    def worst_first(self, values: Dict[str, float]) -> List[str]:
        """Keys of ``values`` from the worst figure to the best (stable for ties)."""
        return sorted(values, key=lambda k: values[k], reverse=not self.higher_is_better)


#: The accuracy debugger's metrics (ptq_guide, "Accuracy Debug Tool"), by the names users type.
METRICS: Dict[str, Metric] = {
    "cosine-similarity": Metric("cosine-similarity", cosine_similarity, True),
    "mse": Metric("mse", mse, False),
    "mre": Metric("mre", mre, False),
    "sqnr": Metric("sqnr", sqnr, True),
    "chebyshev": Metric("chebyshev", chebyshev, False),
}


def broadcast_scale(scale: Sequence[float], shape: Sequence[int], axis: int = -1) -> np.ndarray:
    """A quantization step per element: per tensor, or per channel along ``axis``."""
    s = np.asarray(list(scale), dtype=np.float64).reshape(-1)
    if s.size <= 1:
        return np.full(tuple(shape), s[0] if s.size else 1.0)
    shape = tuple(shape)
    ax = axis if axis >= 0 else len(shape) + axis
    if not 0 <= ax < len(shape) or shape[ax] != s.size:
        raise ValueError(f"{s.size} per-channel scales do not fit shape {list(shape)} on axis {axis}")
    view = [1] * len(shape)
    view[ax] = s.size
    return np.broadcast_to(s.reshape(view), shape)


def lsb_distance(a, b, scale: Sequence[float] = (1.0,), axis: int = -1) -> np.ndarray:
    """|a - b| in quantization steps (elementwise; same shapes required)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {list(a.shape)} vs {list(b.shape)}")
    return np.abs(a - b) / broadcast_scale(scale, a.shape, axis)


@dataclass
class Mismatch:
    line_miss: int = 0
    line_diff: int = 0
    line_nan: int = 0

    @property
    def total(self) -> int:
        return self.line_miss + self.line_diff + self.line_nan


def differing(a, b, digits: int = DEFAULT_DIGITS, lsb: Optional[float] = None,
              scale: Optional[Sequence[float]] = None, axis: int = -1) -> np.ndarray:
    """Boolean mask over the common prefix: positions that differ (NaNs excluded)."""
    x, y = _flat_pair(a, b)
    nan = np.isnan(x) | np.isnan(y)
    with np.errstate(invalid="ignore"):
        diff = (np.round(x, digits) != np.round(y, digits)) & ~nan
    if lsb is not None and diff.any():
        a_arr = np.asarray(a)
        if scale is not None and a_arr.shape == np.asarray(b).shape:
            step = broadcast_scale(scale, a_arr.shape, axis).reshape(-1)
        else:
            step = np.full(x.shape, float(np.asarray(scale if scale is not None else [1.0]).reshape(-1)[0]))
        # A small slack in steps: float32 products of (q * scale) round to ~1e-5 LSB.
        diff &= np.abs(x - y) / step[: x.size] > lsb + LSB_SLACK
    return diff


def count_mismatch(a, b, digits: int = DEFAULT_DIGITS, lsb: Optional[float] = None,
                   scale: Optional[Sequence[float]] = None, axis: int = -1) -> Mismatch:
    a, b = np.asarray(a), np.asarray(b)
    x, y = _flat_pair(a, b)
    return Mismatch(
        line_miss=abs(a.size - b.size),
        line_diff=int(differing(a, b, digits, lsb, scale, axis).sum()),
        line_nan=int((np.isnan(x) | np.isnan(y)).sum()),
    )


@dataclass
class TensorComparison:
    """Every figure for one pair of tensors, and whether the strict check passed."""

    name_a: str
    name_b: str
    shape_a: List[int]
    shape_b: List[int]
    dtype_a: str
    dtype_b: str
    mismatch: Mismatch
    total: int
    mismatch_rate: float
    relative_mismatch_ratio: float
    max_abs_error: float
    cosine: float
    mse: float
    digits: int
    #: Fraction of equal elements, for labels (integer outputs without a quantization
    #: scale: indices, class ids), where it replaces the cosine (None: the cosine is the figure).
    agreement: Optional[float] = None
    #: Quantization step used for LSB figures (None: not a quantized tensor).
    scale: Optional[List[float]] = None
    #: Largest |a - b| in quantization steps (None without a scale).
    max_lsb_error: Optional[float] = None
    #: --lsb tolerance applied (None: digits only).
    lsb_tolerance: Optional[float] = None

    @property
    def passed(self) -> bool:
        return self.mismatch.total == 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mismatch"]["total"] = self.mismatch.total
        d["passed"] = self.passed
        return d


def compare_tensors(a, b, name_a: str = "a", name_b: str = "b", digits: int = DEFAULT_DIGITS,
                    lsb: Optional[float] = None, scale: Optional[Sequence[float]] = None,
                    axis: int = -1, labels: bool = False) -> TensorComparison:
    """Compare two tensors; ``scale`` is their quantization step (None: not quantized).

    ``labels``: the tensors are integer labels or indices (ArgMax), so the
    agreement rate is the figure that means something, not the cosine.
    """
    a, b = np.asarray(a), np.asarray(b)
    if scale is None and np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
        scale = [1.0]
    x, y = _flat_pair(a, b)
    same_shape = a.shape == b.shape
    mask = differing(a, b, digits, lsb if scale is not None else None, scale, axis)
    mism = Mismatch(abs(a.size - b.size), int(mask.sum()), int((np.isnan(x) | np.isnan(y)).sum()))
    total = max(a.size, b.size)
    rel = 0.0
    if mask.any():
        dx, dy = x[mask], y[mask]
        denom = np.maximum(np.abs(dx), np.abs(dy))
        rel = float(np.max(np.abs(dx - dy) / denom))  # denom > 0 where values differ
    max_lsb = None
    if scale is not None and same_shape and x.size:
        d = lsb_distance(a, b, scale, axis)
        d = d[~np.isnan(d)]
        max_lsb = float(d.max()) if d.size else 0.0
    return TensorComparison(
        name_a=name_a, name_b=name_b, shape_a=list(a.shape), shape_b=list(b.shape),
        dtype_a=a.dtype.name, dtype_b=b.dtype.name, mismatch=mism, total=int(total),
        mismatch_rate=mism.total / total if total else 0.0, relative_mismatch_ratio=rel,
        max_abs_error=max_abs_error(a, b), cosine=cosine_similarity(a, b), mse=mse(a, b), digits=digits,
        agreement=agreement_rate(a, b) if labels else None,
        scale=[float(s) for s in scale] if scale is not None else None, max_lsb_error=max_lsb,
        lsb_tolerance=lsb if scale is not None else None,
    )


@dataclass
class Divergence:
    """The first tensor, in topological order, where two sides disagree."""

    tensor: str
    index: int  # position in the order given
    comparison: TensorComparison


def first_divergence(order: Iterable[str], a: Dict[str, np.ndarray], b: Dict[str, np.ndarray],
                     compare=compare_tensors) -> Optional[Divergence]:
    """Walk ``order`` (tensor names, topologically sorted) and return the first
    tensor both sides hold that fails ``compare(a[name], b[name], name, name)``."""
    for i, name in enumerate(order):
        if name in a and name in b:
            result = compare(a[name], b[name], name, name)
            if not result.passed:
                return Divergence(name, i, result)
    return None
