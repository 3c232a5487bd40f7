"""Activation statistics, collected once per model and shared by every calibration method.

The collector follows onnxruntime's calibrator lifecycle: ``augment_graph``
(the float model also outputs every tensor calibration needs),
``collect_data`` (stream the samples through onnxruntime, keeping only running
statistics, never all activations), ``compute_data`` (the per-tensor
``TensorStats``). Two passes over the samples: the first finds each tensor's
range (min, max, per-channel min/max along axis 1), the second fills a
histogram of |x| over [0, absmax] with a fixed bin count, so histograms of
different samples add up exactly. Methods that need no histogram (max) skip
the second pass, and per-tensor ones the per-channel ranges.

Both passes run the samples on the host's sample workers (one per core,
``onnxgraph.imap_samples``); each worker reduces its sample's tensors to a
summary (a range, a histogram) at once, and the summaries are added in sample
order as they come, so the statistics are exactly those of one sequential loop
(min, max and integer counts do not depend on the order anyway) and no more
than a few samples' summaries wait (a histogram per tensor per sample: 3 MB on
PP-OCRv4 det, 300 MB had 100 samples' waited).

Memory: the augmented model runs in parts (``onnxgraph.Parts``, about 2 MB of
activations each when they take more than 64 MB, in the process's shared
onnxruntime arena), each part's tensors summarised before the next part runs:
on PP-OCRv4 det at 640x640 a worker holds one part's activations instead of the
run's 376 MB, still in the core's cache when they are summarised, for less CPU
time than whole runs (parts.CUT_BYTES) and the same values
(tests/host/test_real_models.py).

Why two passes and not one: the histogram's bins span [0, absmax] of *all*
samples, which is known only after the last one; a one-pass histogram over a
growing range (onnxruntime's) re-bins and is no longer exact, and keeping the
activations for a second look costs gigabytes on a detector. A one-pass
histogram on a power-of-two grid re-binned at the end was tried: it moved the
percentile and KL thresholds of some tensors, changed the calibrated models,
and was not cheaper (bench/RESULTS.md, "Statistics, kernels and parts").

Where the time goes: each pass's run with every tensor an output is most of
it; the ranges and the histogram are compiled kernels (``kernels``: each value
read once, outside the GIL; from ``COMPILED_FROM`` bytes of activations on,
numpy below) with the counts numpy's formulas give. Reducing inside the
onnxruntime graph instead (ReduceMin/ReduceMax, Mul -> Cast to int16 for the
bins) gives the same statistics in half the memory but makes each run slower
than reducing outside costs, so the tensors come out whole. With the kernels
the two sample workers are threads that scale about as well as forked
processes.

A NaN or an infinity in a calibrated tensor is refused (InvalidInput naming the
tensor): no threshold can be derived from it (numpy's histogram failed on it
with a ValueError).
"""
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import onnx

from bpuemu.common.errors import InvalidInput
from bpuemu.host.onnxgraph import TensorInfo, imap_samples, open_parted, with_outputs
from bpuemu.host.onnxgraph.parts import tensor_bytes

#: Bytes of calibrated activations over all samples (what each pass reads) from which the ranges and
#: histograms are counted by the compiled kernels (``kernels``: about 2 ns a value less than numpy's
#: reductions, but importing numba and its first call cost about 0.7 s a process): PP-OCRv4 det at
#: 320x320 and up with 20 samples (1.9 GB at 320), not det 160, PP-OCR cls or the sample CNN, where
#: the kernels measured 0.5-0.8 s slower a conversion. Below it numpy counts the same values.
COMPILED_FROM = 1 << 30

#: Values numpy bins per step of a histogram (float32 and int32 index buffers of 64 KB each).
HIST_CHUNK = 1 << 14


def numpy_ranges(x: np.ndarray, per_channel: bool = True):
    """``kernels.ranges`` with numpy: min, max and, along axis 1 of the (N, C, rest) view (when
    ``per_channel`` and ``x`` has one), the per-channel min and max; None for an empty tensor."""
    x = np.asarray(x, np.float32)
    if x.size == 0:
        return None
    if per_channel and x.ndim >= 2:
        v = x.reshape(x.shape[0], x.shape[1], -1)          # a view: no copy, unlike moving axis 1 first
        cmin, cmax = v.min(axis=2).min(axis=0), v.max(axis=2).max(axis=0)
        return float(cmin.min()), float(cmax.max()), cmin, cmax
    return float(x.min()), float(x.max()), None, None


def numpy_histogram(x: np.ndarray, absmax: float, bins: int) -> np.ndarray:
    """``kernels.histogram`` with numpy: bin = the truncation of float32 |x| * float32(bins / absmax),
    the top edge in the last bin, chunk by chunk through two small buffers that stay in the CPU cache."""
    with np.errstate(over="ignore", divide="ignore"):
        k = np.float32(bins / absmax) if absmax > 0 else np.float32(np.inf)
    counts = np.zeros(bins + 1, np.int64)
    if not np.isfinite(k):
        counts[0] = x.size
        return counts[:bins]
    flat = np.asarray(x).reshape(-1)
    step = max(1, min(HIST_CHUNK, flat.size))
    scaled, index = np.empty(step, np.float32), np.empty(step, np.int32)
    for start in range(0, flat.size, step):
        part = flat[start:start + step]
        y, i = scaled[: part.size], index[: part.size]
        np.abs(part, out=y)
        np.multiply(y, k, out=y)
        i[...] = y                      # truncation toward zero, as astype
        counts += np.bincount(i, minlength=bins + 1)
    counts[bins - 1] += counts[bins:].sum()
    return counts[:bins]


@dataclass
class TensorStats:
    """Statistics of one activation tensor over all calibration samples."""

    min: float
    max: float
    channel_min: Optional[np.ndarray]   # along axis 1, when the tensor has one
    channel_max: Optional[np.ndarray]
    hist: Optional[np.ndarray]          # counts of |x| in bins over [0, absmax]; None when not collected
    count: int

    @property
    def absmax(self) -> float:
        return max(abs(self.min), abs(self.max))

    @property
    def bin_width(self) -> float:
        return self.absmax / len(self.hist) if self.hist is not None and len(self.hist) else 0.0

    @property
    def channel_absmax(self) -> Optional[np.ndarray]:
        if self.channel_min is None:
            return None
        return np.maximum(np.abs(self.channel_min), np.abs(self.channel_max))

    @classmethod
    def of(cls, values: np.ndarray, bins: int = 2048, compiled: bool = False) -> "TensorStats":
        """Statistics of one array (tests, and tensors seen once); ``compiled``: with the kernels."""
        acc = _Accumulator(bins, compiled=compiled)
        x = np.asarray(values, np.float32)
        acc.update_range(x)
        acc.update_hist(x)
        return acc.stats()


class _Accumulator:
    """Running statistics of one tensor: range first, then the histogram.

    Each sample is summarised on its own (``range_of``, ``hist_of``: what a
    worker thread computes) and the summaries are added in sample order
    (``add_range``, ``add_hist``), so the statistics do not depend on how many
    threads computed them.
    """

    def __init__(self, bins: int, histogram: bool = True, per_channel: bool = True, name: str = "the tensor",
                 compiled: bool = False):
        self.name = name
        self.compiled = compiled
        self.bins = bins
        self.lo = self.hi = None
        self.cmin = self.cmax = None
        self.per_channel = per_channel
        self.count = 0
        self.hist = np.zeros(bins, np.int64) if histogram else None

    @property
    def compiled(self) -> bool:
        """Whether the compiled kernels count (else numpy: the same values)."""
        return self._ranges is not numpy_ranges

    @compiled.setter
    def compiled(self, on: bool) -> None:
        # The two reductions chosen once here, not per tensor and sample (kernels imports numba: ~0.5 s).
        if on:
            from bpuemu.host.quant import kernels
            self._ranges, self._histogram = kernels.ranges, kernels.histogram
        else:
            self._ranges, self._histogram = numpy_ranges, numpy_histogram

    def range_of(self, x: np.ndarray) -> Optional[tuple]:
        """(min, max, size, per-channel min, max along axis 1 or None) of one sample's values."""
        r = self._ranges(x, self.per_channel)
        if r is None:
            return None
        lo, hi, cmin, cmax = r
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise InvalidInput(f"calibration: tensor '{self.name}' has NaN or infinite values",
                               hint="check the calibration data and its preprocessing (mean, scale, input type)")
        return lo, hi, x.size, cmin, cmax

    def add_range(self, summary: Optional[tuple]) -> None:
        if summary is None:
            return
        lo, hi, size, cmin, cmax = summary
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)
        self.count += size
        if cmin is None:
            self.per_channel = False
        if not self.per_channel:
            return
        if self.cmin is None:
            self.cmin, self.cmax = cmin, cmax
        elif self.cmin.shape == cmin.shape:
            self.cmin, self.cmax = np.minimum(self.cmin, cmin), np.maximum(self.cmax, cmax)
        else:
            self.per_channel = False

    def update_range(self, x: np.ndarray) -> None:
        self.add_range(self.range_of(x))

    def hist_of(self, x: np.ndarray) -> Optional[np.ndarray]:
        """Counts of one sample's |x| in ``bins`` bins over [0, absmax] (absmax: the range pass's)."""
        if self.lo is None or self.hist is None:
            return None
        return self._histogram(x, max(abs(self.lo), abs(self.hi)), self.bins)

    def add_hist(self, counts: Optional[np.ndarray]) -> None:
        if counts is not None:
            self.hist += counts

    def update_hist(self, x: np.ndarray) -> None:
        self.add_hist(self.hist_of(x))

    def stats(self) -> Optional[TensorStats]:
        if self.lo is None:
            return None
        pc = self.per_channel and self.cmin is not None
        return TensorStats(self.lo, self.hi, self.cmin if pc else None, self.cmax if pc else None, self.hist, self.count)


class StatisticsCollector:
    """augment_graph -> collect_data -> compute_data, for the tensors a plan quantizes."""

    def __init__(self, model: onnx.ModelProto, tensors: Sequence[str], infos: Mapping[str, TensorInfo], bins: int = 2048,
                 histograms: bool = True, per_channel: bool = True):
        self.model = model
        self.tensors = list(dict.fromkeys(tensors))
        self.infos = infos
        self.bins = bins
        self.histograms = histograms
        self.augmented: Optional[onnx.ModelProto] = None
        self._acc = {t: _Accumulator(bins, histograms, per_channel, t) for t in self.tensors}

    def augment_graph(self) -> onnx.ModelProto:
        self.augmented = with_outputs(self.model, self.tensors, self.infos)
        return self.augmented

    def _run_names(self, samples) -> List[str]:
        """The tensors the augmented model's runs give: those the samples do not hold already (model inputs)."""
        return [t for t in self.tensors if t not in samples[0]] if samples else []

    def _pass(self, sess, samples, summarise, add) -> None:
        """One pass over the samples: the model's runs and ``summarise`` spread over the sample
        workers (onnxgraph.imap_samples), the summaries added in sample order as they come."""
        names = self._run_names(samples)
        fed = [t for t in self.tensors if t not in names]

        def summarised(i, items):
            try:
                return {t: summarise(self._acc[t], x) for t, x in items}
            except InvalidInput as exc:
                raise InvalidInput(f"{exc.message} on calibration sample {i + 1} of {len(samples)}", exc.hint) from None

        def per_part(i, values):      # a part's {name: value}, or the whole run's values in ``names`` order
            return summarised(i, values.items() if isinstance(values, dict) else zip(names, values))

        if names:
            for summary in imap_samples(sess, names, samples, per_part):
                for t, value in summary.items():
                    add(self._acc[t], value)
        for i, sample in enumerate(samples):
            for t, value in summarised(i, [(t, np.asarray(sample[t], dtype=np.float32)) for t in fed]).items():
                add(self._acc[t], value)

    def session(self, samples):
        """What runs the augmented model: its parts (onnxgraph.Parts: one part's activations in
        memory per sample worker at a time), or one session when it is one part."""
        return open_parted(self.augmented, self._run_names(samples), self.infos)

    def collect_data(self, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
        if self.augmented is None:
            self.augment_graph()
        samples = list(samples)
        sizes = [tensor_bytes(self.infos.get(t)) for t in self.tensors]
        compiled = None in sizes or sum(sizes) * len(samples) >= COMPILED_FROM
        for acc in self._acc.values():
            acc.compiled = compiled
        sess = self.session(samples)
        self._pass(sess, samples, _Accumulator.range_of, _Accumulator.add_range)
        if self.histograms:
            self._pass(sess, samples, _Accumulator.hist_of, _Accumulator.add_hist)

    def compute_data(self) -> Dict[str, TensorStats]:
        out = {}
        for t, acc in self._acc.items():
            st = acc.stats()
            if st is not None:
                out[t] = st
        return out


def collect_statistics(
    model: onnx.ModelProto,
    tensors: Sequence[str],
    samples: Sequence[Mapping[str, np.ndarray]],
    infos: Mapping[str, TensorInfo],
    bins: int = 2048,
    histograms: bool = True,
    per_channel: bool = True,
) -> Dict[str, TensorStats]:
    """``histograms``: whether any method will need them (KL, percentiles); ``per_channel``:
    whether per-channel featuremap ranges will be asked for."""
    c = StatisticsCollector(model, tensors, infos, bins, histograms, per_channel)
    c.augment_graph()
    c.collect_data(samples)
    return c.compute_data()

