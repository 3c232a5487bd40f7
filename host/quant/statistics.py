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
"""
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence

import numpy as np
import onnx

from bpuemu.host.onnxgraph import TensorInfo, feed_for, open_session, with_outputs


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
    def of(cls, values: np.ndarray, bins: int = 2048) -> "TensorStats":
        """Statistics of one array (tests, and tensors seen once)."""
        acc = _Accumulator(bins)
        x = np.asarray(values, np.float32)
        acc.update_range(x)
        acc.update_hist(x)
        return acc.stats()


class _Accumulator:
    """Running statistics of one tensor: range first, then the histogram."""

    def __init__(self, bins: int, histogram: bool = True, per_channel: bool = True):
        self.bins = bins
        self.lo = self.hi = None
        self.cmin = self.cmax = None
        self.per_channel = per_channel
        self.count = 0
        self.hist = np.zeros(bins, np.int64) if histogram else None

    def update_range(self, x: np.ndarray) -> None:
        if x.size == 0:
            return
        lo, hi = float(x.min()), float(x.max())
        self.lo = lo if self.lo is None else min(self.lo, lo)
        self.hi = hi if self.hi is None else max(self.hi, hi)
        self.count += x.size
        if x.ndim < 2:
            self.per_channel = False
        if not self.per_channel:
            return
        moved = np.moveaxis(x, 1, 0).reshape(x.shape[1], -1)
        cmin, cmax = moved.min(axis=1), moved.max(axis=1)
        if self.cmin is None:
            self.cmin, self.cmax = cmin, cmax
        elif self.cmin.shape == cmin.shape:
            self.cmin, self.cmax = np.minimum(self.cmin, cmin), np.maximum(self.cmax, cmax)
        else:
            self.per_channel = False

    def update_hist(self, x: np.ndarray) -> None:
        if self.lo is None or self.hist is None:
            return
        absmax = max(abs(self.lo), abs(self.hi))
        if absmax <= 0:
            self.hist[0] += x.size
            return
        idx = np.minimum((np.abs(x.reshape(-1)) * np.float32(self.bins / absmax)).astype(np.int64), self.bins - 1)
        self.hist += np.bincount(idx, minlength=self.bins)

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
        self._acc = {t: _Accumulator(bins, histograms, per_channel) for t in self.tensors}

    def augment_graph(self) -> onnx.ModelProto:
        self.augmented = with_outputs(self.model, self.tensors, self.infos)
        return self.augmented

    def _run(self, sess, sample) -> Dict[str, np.ndarray]:
        names = [t for t in self.tensors if t not in sample]
        values = dict(zip(names, sess.run(names, feed_for(sess, sample)))) if names else {}
        for t in self.tensors:
            if t in sample:
                values[t] = np.asarray(sample[t], dtype=np.float32)
        return values

    def collect_data(self, samples: Sequence[Mapping[str, np.ndarray]]) -> None:
        if self.augmented is None:
            self.augment_graph()
        sess = open_session(self.augmented)
        for sample in samples:
            for t, x in self._run(sess, sample).items():
                self._acc[t].update_range(x)
        if not self.histograms:
            return
        for sample in samples:
            for t, x in self._run(sess, sample).items():
                self._acc[t].update_hist(x)

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

