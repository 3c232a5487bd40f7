"""Quantization parameters: what calibration hands quantization.

``TensorQuant`` is one activation tensor's parameters (threshold, scale, zero
point, int8/int16, the method that produced them), ``WeightQuant`` one weight's
per-channel symmetric int8 values, ``QuantParams`` the whole set plus the
record of the search. The scale/zero-point arithmetic lives here, once.
"""
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np

from bpuemu.common.numerics import dequantize

if TYPE_CHECKING:  # pragma: no cover
    from bpuemu.host.quant.marking import QuantPlan
    from bpuemu.host.quant.options import QuantOptions

INT_RANGE = {"int8": (-128, 127), "int16": (-32768, 32767)}
NP_DTYPE = {"int8": np.int8, "int16": np.int16}
#: A threshold below this is treated as "the tensor was all zeros during calibration".
MIN_THRESHOLD = 1e-6


def symmetric_qmax(dtype: str) -> int:
    return INT_RANGE[dtype][1]


@dataclass
class TensorQuant:
    """Quantization of one activation tensor (per-tensor, or per-channel along ``axis``)."""

    tensor: str
    dtype: str                   # "int8" | "int16"
    scale: np.ndarray            # float32, shape () or (C,)
    zero_point: np.ndarray       # integer values of ``dtype``, same shape as scale
    threshold: np.ndarray        # float32, same shape: the calibrated |x| threshold(s)
    method: str                  # "max", "max-percentile 0.99995", "kl", "load", "fixed" (X_128 input)
    axis: Optional[int] = None   # per-channel axis, None when per-tensor

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    @property
    def asymmetric(self) -> bool:
        return bool(np.any(self.zero_point != 0))

    @property
    def max_threshold(self) -> float:
        return float(np.max(self.threshold))

    def zero_point_array(self) -> np.ndarray:
        return np.asarray(self.zero_point).astype(NP_DTYPE[self.dtype])


def symmetric(tensor: str, threshold, dtype: str, method: str, axis: Optional[int] = None) -> TensorQuant:
    """scale = threshold / 127 (or / 32767), zero point 0."""
    t = np.maximum(np.asarray(threshold, dtype=np.float64), MIN_THRESHOLD)
    scale = (t / symmetric_qmax(dtype)).astype(np.float32)
    return TensorQuant(tensor, dtype, scale, np.zeros(scale.shape, np.int64), t.astype(np.float32), method, axis)


def asymmetric(tensor: str, lo, hi, dtype: str, method: str, axis: Optional[int] = None) -> TensorQuant:
    """Range [lo, hi] (widened to hold 0 exactly) over all 255 (65535) levels."""
    qmin, qmax = INT_RANGE[dtype]
    lo = np.minimum(np.asarray(lo, dtype=np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, dtype=np.float64), 0.0)
    span = np.maximum(hi - lo, MIN_THRESHOLD)
    scale = span / (qmax - qmin)
    zp = np.clip(np.rint(qmin - lo / scale), qmin, qmax)
    scale = scale.astype(np.float32)
    threshold = np.maximum(np.abs(lo), np.abs(hi)).astype(np.float32)
    return TensorQuant(tensor, dtype, scale, zp.astype(np.int64), threshold, method, axis)


def requantized(q: TensorQuant) -> TensorQuant:
    """One scale for a per-channel tensor, for an op that takes one (``QuantPlan.single_scale_reads``): the
    per-tensor range that holds every channel's quantized range, symmetric or asymmetric as ``q`` is (for the
    calibration methods this is the range they give the tensor per tensor)."""
    if not q.asymmetric:
        return symmetric(q.tensor, q.max_threshold, q.dtype, q.method)
    qmin, qmax = INT_RANGE[q.dtype]
    scale, zp = q.scale.astype(np.float64), q.zero_point.astype(np.float64)
    return asymmetric(q.tensor, np.min((qmin - zp) * scale), np.max((qmax - zp) * scale), q.dtype, q.method)


def fixed_int8_input(tensor: str) -> TensorQuant:
    """An X_128 image input: int8 values exactly, so scale 1 / zero point 0 (threshold 127)."""
    return TensorQuant(tensor, "int8", np.array(1.0, np.float32), np.array(0, np.int64), np.array(127.0, np.float32), "fixed")


@dataclass
class WeightQuant:
    """Per-channel symmetric int8 weight (zero point 0) along ``axis``."""

    tensor: str
    axis: int
    scale: np.ndarray            # float32 (C,)
    quantized: np.ndarray        # int8, the weight's shape
    method: str = "max"

    @property
    def threshold(self) -> np.ndarray:
        return (self.scale * 127).astype(np.float32)

    def dequantized(self) -> np.ndarray:
        return dequantize(self.quantized, self.scale, None, self.axis)


def quantize_weight(tensor: str, w: np.ndarray, axis: int) -> WeightQuant:
    """Per-channel max calibration: scale_c = max|w_c| / 127 (an all-zero channel gets 1/127)."""
    w = np.asarray(w, dtype=np.float32)
    axis = axis % w.ndim
    absmax = np.max(np.abs(np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)), axis=1)
    scale = np.where(absmax > 0, absmax, 1.0).astype(np.float32) / np.float32(127)
    shape = [1] * w.ndim
    shape[axis] = scale.size
    # Float32 division and round-half-to-even: what QuantizeLinear would compute.
    q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    return WeightQuant(tensor, axis, scale, q)


@dataclass
class Candidate:
    """One calibration the search evaluated, and its output cosine similarity."""

    name: str
    cosine: float                 # its score; an upper bound of it when it was not scored on every sample
    per_output: Dict[str, float] = field(default_factory=dict)   # empty when not scored on every sample
    samples: int = 0              # evaluation samples it was scored on (0: not counted)


@dataclass
class QuantParams:
    """Everything quantization needs; produced by ``calibrate``.

    ``activations`` is keyed by tensor name, ``weights`` by weight initializer
    name. ``method`` names what was chosen ("kl", "max-percentile 0.99995",
    "mix", "load", ...), ``candidates`` what the search tried.
    """

    activations: Dict[str, TensorQuant]
    weights: Dict[str, WeightQuant]
    method: str
    plan: "QuantPlan"
    options: "QuantOptions"
    per_channel: bool = False
    asymmetric: bool = False
    candidates: List[Candidate] = field(default_factory=list)
    #: node name -> corrected float bias (bias_correction)
    bias_corrections: Dict[str, np.ndarray] = field(default_factory=dict)
    #: node name -> per-node method chosen by mix
    node_methods: Dict[str, str] = field(default_factory=dict)

    @property
    def description(self) -> str:
        parts = [self.method]
        if self.per_channel:
            parts.append("perchannel")
        if self.asymmetric:
            parts.append("asymmetric")
        return " + ".join(parts)

    def node_thresholds(self) -> Dict[str, float]:
        """Node -> the threshold of its quantized input activation (the largest when several).

        What makertbin prints in its "Threshold" column: the calibration node
        sits in front of the node it quantizes.
        """
        out: Dict[str, float] = {}
        for node, tensors in self.plan.node_activation_inputs.items():
            values = [self.activations[t].max_threshold for t in tensors if t in self.activations]
            if values:
                out[node] = max(values)
        return out

    def requantizations(self) -> Dict[str, TensorQuant]:
        """Per-channel tensor -> the one scale its readers that take one read it at (``requantized``)."""
        return {t: requantized(self.activations[t]) for t in self.plan.single_scale_reads
                if self.activations[t].per_channel}

    def int16_tensors(self) -> List[str]:
        return [t for t, q in self.activations.items() if q.dtype == "int16"]

    def summary(self) -> List[Tuple[str, str, float, str]]:
        """(tensor, dtype, max threshold, method) rows, in plan order."""
        return [(t, q.dtype, q.max_threshold, q.method) for t, q in self.activations.items()]
