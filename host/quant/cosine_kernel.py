"""The cosine table's cosine, compiled: x.x, y.y and x.y of two float32 tensors in one read.

``compiled_cosine(a, b)`` is ``bpuemu.common.compare.cosine_similarity`` (flattened,
common prefix, NaNs skipped, the all-zero conventions) with the three sums
taken in one pass over both tensors instead of three numpy einsum passes that
each cast to float64 (about a quarter of their time: bench/RESULTS.md; on
PP-OCRv4 det 640x640 the table sums 94 M values a sample).

The sums are float64, as numpy's, and at least as exact: a float32 product is
exact in float64; each block of ``BLOCK`` values is summed by LLVM's
vectorised reduction (any order of summing B terms errs by at most (B - 1) eps
of the sum of their magnitudes, 1023 eps here), and the blocks' sums are added
with Neumaier's compensation (about 2 eps more). einsum's bound on the same
sums is about 2048 + n / 8192 eps (4 lanes over buffers of 8192 values, the
buffers added in turn). A printed cosine (6 decimals) moves only when the true
value lies within about 1e-13 of a rounding edge; on the sample CNN, PP-OCR cls
and det the tables print the same (tests/host/test_quant.py).

numba compiles the kernel on its first call and keeps the machine code on disk
(``cache=True``); importing numba costs about 0.3-0.5 s, so ``similarity``
uses it only for tables big enough to gain (``COMPILED_FROM``).
"""
import numpy as np
from bpuemu.common.compare import _sums as _numpy_sums
from bpuemu.common.compare import cosine_similarity
from bpuemu.host.quant.kernels import compiled

#: Values a block's vectorised reduction sums before the blocks' compensated sum.
BLOCK = 1024


@compiled(fastmath={"reassoc", "contract"})
def _block(x, y, start, end):  # pragma: no cover -- runs compiled
    xx = 0.0
    yy = 0.0
    xy = 0.0
    for i in range(start, end):
        u = np.float64(x[i])
        v = np.float64(y[i])
        xx += u * u
        yy += v * v
        xy += u * v
    return xx, yy, xy


@compiled
def _add(total, carry, value):  # pragma: no cover -- runs compiled
    """Neumaier's compensated addition: (new total, new carry)."""
    t = total + value
    if abs(total) >= abs(value):
        carry += (total - t) + value
    else:
        carry += (value - t) + total
    return t, carry


@compiled
def _sums(x, y):  # pragma: no cover -- runs compiled
    n = x.size
    txx = cxx = tyy = cyy = txy = cxy = 0.0
    for start in range(0, n, BLOCK):
        xx, yy, xy = _block(x, y, start, min(n, start + BLOCK))
        txx, cxx = _add(txx, cxx, xx)
        tyy, cyy = _add(tyy, cyy, yy)
        txy, cxy = _add(txy, cxy, xy)
    return _total(txx, cxx), _total(tyy, cyy), _total(txy, cxy)


@compiled
def _total(total, carry):  # pragma: no cover -- runs compiled
    """The compensated sum; an infinite or NaN total as it is (its carry is NaN)."""
    return total + carry if np.isfinite(total) else total


def sums(x: np.ndarray, y: np.ndarray):
    """x.x, y.y and x.y of two flat tensors in float64: compiled for float32 (module docstring),
    numpy's einsum for other dtypes."""
    if x.dtype != np.float32 or y.dtype != np.float32:
        return _numpy_sums(x, y)
    return _sums(x, y)


def compiled_cosine(a, b) -> float:
    """``cosine_similarity(a, b)`` (its conventions: flattened, common prefix, NaNs skipped, all-zero
    tensors) with the sums of float32 tensors compiled."""
    return cosine_similarity(a, b, sums)
