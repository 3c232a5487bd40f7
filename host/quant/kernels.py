"""The calibration statistics' two reductions, compiled: each activation value is read once.

``ranges``: the minimum and maximum of a float32 tensor along axis 1 of its
(N, C, rest) view (one channel when there is no axis 1), in one read.
``histogram``: the counts of |x| in ``bins`` bins over [0, absmax], the bin of a
value being the truncation of the float32 product ``|x| * float32(bins /
absmax)`` with the top edge (|x| == absmax) in the last bin: the numpy
formula ``(np.abs(x) * k).astype(np.int32)`` clipped to ``bins - 1``, value
for value (tests/host/test_stat_kernels.py checks both against numpy on real
activations and on edge cases).

They are numba functions compiled on their first call (``nogil``: two sample
workers count side by side; ``cache``: the machine code is kept on disk, in
``__pycache__`` beside this file or, when that is not writable (a system-wide
install), in numba's user-wide cache, ``~/.cache/numba``), so a machine pays
the compile once (about a second or two), not once per process: a process
reading them from the cache pays only numba's own start on its first call, the
threads of one process share them. Import this module only where it is used
(``statistics``, from ``statistics.COMPILED_FROM`` bytes of activations on):
importing numba takes about half a second.

How the work is done, and why (PP-OCRv4 det 640x640 has 94 M values a sample
over 189 tensors; the side-by-side timings behind each choice are in
bench/RESULTS.md, "Statistics, kernels and parts"):
- ranges: the float32 bits are compared as int32 keys (``bits ^ ((bits >> 31) &
  0x7fffffff)`` orders as the floats do, with -0.0 below +0.0 and NaN beyond
  +-inf), which LLVM vectorises; its float min/max it does not (NaN
  semantics), not even with fastmath. Each row is read in parts of 1024
  values, the next part asked for (a prefetch, as the histogram's) while one
  is read, so one read does what numpy's min then max do in two.
- histogram: the indices of 2048 values at a time (vectorised; the block is a
  slice indexed from 0, as ``flat[start + t]`` made LLVM gather the values one
  by one), and a flag for each, whether its bin is not the previous value's
  (vectorised too); then 16 values at a time: when their flags say they are in
  one bin, one count of 16, else each half of 8 in one bin one count of 8, the
  others one count each, into 4 sub-histograms in turn (2 or 8 were slower),
  so that runs of values in one bin do not wait on each other's stores;
  unsigned indices (no negative-index check). On text pages most values are in
  their previous value's bin (a page's plain background: stretches of a feature
  map alike), so about half a count a value instead of one. While a block is
  counted, the values of the next one are asked for (LLVM's prefetch, one
  64-byte line per 16 values), so its indices are computed from the CPU cache
  instead of waiting on memory.
"""
from typing import Optional, Tuple

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

#: Values whose bin indices are computed before they are counted (an 8 KB buffer).
_BLOCK = 2048
#: Sub-histograms counted in turn (a power of two).
_SUB = 4
#: Values whose bins are checked for being one bin together (two words of flags).
_RUN = 16
#: Values the ranges read ahead of (one read of a part, the next one asked for).
_AHEAD = 1024
#: Values counted per kernel call: the sub-histograms' uint32 counts cannot overflow.
_CALL = 1 << 30

def compiled(fn=None, **options):
    """``fn`` compiled on its first call, outside the GIL, and kept in numba's cache; compiled in each
    process when numba finds no writable place for its cache (a read-only install and no writable
    home: numba then refuses ``cache=True`` at import). ``options``: more of njit's (fastmath=...).
    The one way host/quant compiles a kernel (``cosine_kernel`` too)."""
    if fn is None:
        return lambda f: compiled(f, **options)
    try:
        return njit(nogil=True, cache=True, **options)(fn)
    except RuntimeError:        # "cannot cache function ...: no locator available"
        return njit(nogil=True, **options)(fn)


@intrinsic
def _prefetch(typingctx, arr, i):
    """A hint that ``arr[i]`` will be read soon (LLVM's prefetch: x86 prefetcht0, arm PRFM); it never
    faults and changes no value. Unlike a load, the CPU does not wait for it to arrive."""
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p = builder.bitcast(ptr, ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        # "llvm.prefetch" unmangled: LLVM names it for the pointer type (p0i8 typed, p0 opaque).
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p.type, i32, i32, i32]),
                                            "llvm.prefetch")
        builder.call(fn, [i8p, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])   # read, keep, data
        return context.get_dummy_value()
    return types.void(arr, i), codegen


@compiled
def _range_keys(v, lo, hi, flat):  # pragma: no cover -- runs compiled
    """v: the int32 bits of a float32 (N, C, R) tensor; lo, hi: (C,) int32 order keys, updated;
    flat: v as one row (for asking for the values ahead, across rows)."""
    m = np.int32(0x7FFFFFFF)
    s = np.int32(31)
    n = flat.size
    for i in range(v.shape[0]):
        for j in range(v.shape[1]):
            row = v[i, j]
            at = (i * v.shape[1] + j) * row.size
            a = lo[j]
            b = hi[j]
            for start in range(0, row.size, _AHEAD):
                for q in range(at + start + _AHEAD, at + start + 2 * _AHEAD, 16):   # a 64-byte line each
                    _prefetch(flat, q if q < n else n - 1)
                part = row[start:start + _AHEAD]
                for t in range(part.size):
                    bits = part[t]
                    key = np.int32(bits ^ ((bits >> s) & m))
                    a = np.int32(min(a, key))
                    b = np.int32(max(b, key))
            lo[j] = a
            hi[j] = b


@compiled
def _count(flat, k, last, counts, new, words):  # pragma: no cover -- runs compiled
    """flat: float32 values; counts: (_SUB * (last + 1),) uint32, updated; new: (_BLOCK,) uint8 and
    words: (_BLOCK // 8,) uint64, one buffer (``words.view(np.uint8)``, made by the caller: a view
    made here costs 0.6 s more to compile): 1 where a value's bin is not the previous value's, the
    flags of 8 values a word, the first in the low byte."""
    n = flat.size
    idx = np.empty(_BLOCK, np.uint32)
    inner = np.uint64(0xFFFFFFFFFFFFFF00)      # a word's flags but its first value's
    stride = np.uint32(counts.size // _SUB)
    one = np.uint32(1)
    for start in range(0, n, _BLOCK):
        block = flat[start:start + _BLOCK]     # indexed from 0: a plain vector load, not a gather
        w = block.size
        for t in range(w):
            y = abs(block[t]) * k              # float32 x float32, rounded as numpy does
            y = y if y < last else last        # the top edge into the last bin (NaN too)
            idx[t] = np.uint32(np.int32(y))    # truncation toward zero
        for t in range(1, w):
            new[t] = idx[t] != idx[t - 1]
        ahead = start + _BLOCK                 # the next block, a 64-byte line per 16 values
        full = w - w % _RUN
        for r in range(full // _RUN):
            t = r * _RUN
            q = ahead + t
            _prefetch(flat, q if q < n else n - 1)
            first = words[2 * r] & inner       # values 1-7 against their previous ones
            second = words[2 * r + 1]          # values 8-15 (8 against 7)
            if first | second == 0:            # 16 values in one bin: one count of 16
                counts[np.uint32(r & (_SUB - 1)) * stride + idx[t]] += np.uint32(_RUN)
                continue
            for h in range(2):                 # else each half: one count of 8, or 8 counts of 1
                word = first if h == 0 else second & inner
                s = t + 8 * h
                if word == 0:
                    counts[np.uint32((2 * r + h) & (_SUB - 1)) * stride + idx[s]] += np.uint32(8)
                else:
                    for u in range(8):
                        counts[np.uint32(u % _SUB) * stride + idx[s + u]] += one
        for t in range(full, w):
            counts[idx[t]] += one


def _floats(keys: np.ndarray) -> np.ndarray:
    """float32 values of int32 order keys (the key map is its own inverse)."""
    keys = keys.astype(np.int32)
    return (keys ^ ((keys >> 31) & 0x7FFFFFFF)).view(np.float32)


def ranges(x: np.ndarray, per_channel: bool = True) -> Optional[Tuple[float, float, Optional[np.ndarray], Optional[np.ndarray]]]:
    """(min, max, per-channel min, per-channel max) of ``x`` as float32 values; the per-channel
    ones along axis 1 of the (N, C, rest) view, or None when ``per_channel`` is False or ``x`` has
    fewer than 2 axes. None for an empty tensor. A NaN or an infinity makes min or max non-finite
    (the caller refuses it). Of equal zeros, -0.0 is the smaller."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.size == 0:
        return None
    channels = per_channel and x.ndim >= 2
    v = x.reshape(x.shape[0], x.shape[1], -1) if channels else x.reshape(1, 1, -1)
    lo = np.full(v.shape[1], np.iinfo(np.int32).max, np.int32)
    hi = np.full(v.shape[1], np.iinfo(np.int32).min, np.int32)
    _range_keys(v.view(np.int32), lo, hi, x.reshape(-1).view(np.int32))
    cmin, cmax = _floats(lo), _floats(hi)
    gmin, gmax = _floats(lo.min(keepdims=True))[0], _floats(hi.max(keepdims=True))[0]
    if not channels:
        return float(gmin), float(gmax), None, None
    return float(gmin), float(gmax), cmin, cmax


def histogram(x: np.ndarray, absmax: float, bins: int) -> np.ndarray:
    """int64 counts of |x| in ``bins`` bins over [0, absmax] (see the module's docstring); every value
    in bin 0 when ``absmax`` is 0 or so small that float32(bins / absmax) overflows (every
    threshold of such a tensor is below params.MIN_THRESHOLD anyway)."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    with np.errstate(over="ignore", divide="ignore"):
        k = np.float32(bins / absmax) if absmax > 0 else np.float32(np.inf)
    out = np.zeros(bins, np.int64)
    if not np.isfinite(k):
        out[0] = flat.size
        return out
    last = np.float32(bins - 1)
    words = np.zeros(_BLOCK // 8, np.uint64)
    for start in range(0, flat.size, _CALL):
        counts = np.zeros(_SUB * bins, np.uint32)
        _count(flat[start:start + _CALL], k, last, counts, words.view(np.uint8), words)
        out += counts.reshape(_SUB, bins).sum(axis=0, dtype=np.int64)
    return out
