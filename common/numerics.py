"""The arithmetic of the numerical contract (DESIGN.md), written once for every side.

The board runtime's ``_HzDequantize`` steps, the quantizer (reading a QAT
model's weights, dequantizing int8 model outputs for its cosine table) and
hb_verifier (outputs whose Dequantize hb_model_modifier removed) all
dequantize the same way, so they agree bit for bit with onnxruntime's
DequantizeLinear: ``(int32(q) - int32(zero_point))`` as float32, times a
float32 scale, per tensor or per axis.
"""
from typing import Dict, Optional, Sequence, Tuple

import numpy as np


def along_axis(values: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """``values`` shaped to broadcast against a rank-``ndim`` tensor: one value
    as a scalar, several as ``[1, .., C, .., 1]`` with C on ``axis``."""
    v = np.asarray(values).reshape(-1)
    if v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = v.size
    return v.reshape(shape)


class Dequantizer:
    """DequantizeLinear with fixed parameters; the broadcast shapes are made once per tensor rank.

    ``scale``: one value (per tensor) or one per channel of ``axis``;
    ``zero_point``: likewise, or None / empty for 0.
    """

    def __init__(self, scale: Sequence[float], zero_point: Optional[Sequence[int]] = None, axis: int = 1):
        self.scale = np.asarray(scale, dtype=np.float32).reshape(-1)
        zp = np.asarray(zero_point if zero_point is not None else [], dtype=np.int32).reshape(-1)
        self.zero_point = zp if zp.size else np.zeros(1, np.int32)
        self.axis = axis
        self._float_exact_zp = bool(np.all(np.abs(self.zero_point.astype(np.int64)) < (1 << 24)))
        self._by_rank: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}

    def params(self, ndim: int) -> Tuple[np.ndarray, np.ndarray]:
        """(scale, zero point) shaped to broadcast against a rank-``ndim`` tensor."""
        params = self._by_rank.get(ndim)
        if params is None:
            params = self._by_rank[ndim] = (along_axis(self.scale, ndim, self.axis),
                                            along_axis(self.zero_point, ndim, self.axis))
        return params

    def __call__(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q)
        scale, zp = self.params(q.ndim)
        if q.dtype.itemsize <= 2 and q.dtype.kind in "iu" and self._float_exact_zp:
            # Up to 16 bits, q and zp are exact in float32 and so is their difference: one float32
            # array, subtracted into and scaled in place (the int32 detour costs two more passes).
            out = np.subtract(q, zp, dtype=np.float32)
            out *= scale
            return out
        return (q.astype(np.int32) - zp).astype(np.float32) * scale


def dequantize(q: np.ndarray, scale: Sequence[float], zero_point: Optional[Sequence[int]] = None,
               axis: int = 1) -> np.ndarray:
    """``(q - zero_point) * scale`` as onnxruntime's DequantizeLinear computes it."""
    return Dequantizer(scale, zero_point, axis)(q)
