"""The calibration statistics cache: re-converting the same model on the same data skips the statistics passes.

A user converts the same model many times while tuning the yaml; the two exact
statistics passes over the calibration data (statistics.py) are most of each
conversion's wait and give the same ``TensorStats`` every time. They depend on
nothing but the float model calibrated (the plan's graph), the tensors asked
for, the exact sample arrays fed (bytes, dtype, shape, order), the histogram
bin count and the onnxruntime that ran the model, so those are the entry's key
(a SHA-256 digest, ``statistics_key``). What was collected is stored: an entry with histograms and
per-channel ranges serves a request needing less (the extra parts are dropped,
giving exactly what collecting with the request's settings gives); a request
needing more recomputes with both and replaces the entry. The KL thresholds the
calibration derived from the histograms (a pure function of them and of
kl_quantized_bins, and the search's slowest part once the statistics are read:
about 10 ms a tensor) are added to the entry after the calibration.

Where: ``$BPUEMU_CALIBRATION_CACHE`` (a directory, or ``off`` to turn the
cache off), else ``$XDG_CACHE_HOME/bpuemu/calibration``, else
``~/.cache/bpuemu/calibration``. One ``<key>.npz`` per entry (numpy arrays and
a JSON header, read without pickle), written to a temporary file and renamed,
so a reader never sees half an entry; the least recently used entries go when
the directory passes ``LIMIT_BYTES``. An entry that cannot be read is reported
with one WARNING and recomputed; a cache that cannot be written costs only the
reuse.
"""
import hashlib
import json
import logging
import os
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import onnx

from bpuemu.host.onnxgraph import TensorInfo
from bpuemu.host.quant.statistics import TensorStats, collect_statistics

#: The environment variable naming the cache directory, or turning the cache off.
ENV = "BPUEMU_CALIBRATION_CACHE"
OFF = ("off", "0", "no", "false", "none")
#: The cache directory's size bound; PP-OCRv4 det's entry (189 tensors, 2048 bins) is about 3 MB.
LIMIT_BYTES = 512 << 20
#: Bumped when the entry layout or what the statistics mean changes: older entries then miss.
FORMAT = 1

Sample = Mapping[str, np.ndarray]


def cache_dir() -> Optional[Path]:
    """The cache directory, or None when ``BPUEMU_CALIBRATION_CACHE=off``."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in OFF:
        return None
    if value:
        return Path(value).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"   # the XDG spec ignores a relative path
    return base / "bpuemu" / "calibration"


def statistics_key(model: onnx.ModelProto, tensors: Sequence[str], samples: Sequence[Sample],
                   infos: Mapping[str, TensorInfo], bins: int) -> str:
    """The digest of everything the statistics depend on (settings that only drop parts excluded).

    SHA-256, which CPUs with SHA instructions hash about twice as fast as BLAKE2b. The 100 samples
    of PP-OCRv4 det at 640x640 (int8, 123 MB) are hashed before the statistics' first run."""
    import onnxruntime

    head = {"format": FORMAT, "onnxruntime": onnxruntime.__version__, "bins": bins,
            "tensors": [[t, *((infos[t].elem_type, infos[t].shape) if t in infos else ())] for t in tensors],
            "samples": len(samples)}
    h = hashlib.sha256()
    _part(h, json.dumps(head).encode())
    _part(h, model.SerializeToString(deterministic=True))
    for sample in samples:
        for name in sorted(sample):
            a = np.ascontiguousarray(sample[name])
            _part(h, json.dumps([name, a.dtype.str, list(a.shape)]).encode())
            _part(h, a.reshape(-1).view(np.uint8).data if a.size else b"")
    return h.hexdigest()[:40]


def _part(h, data) -> None:
    """Length-prefixed, so no two different inputs hash the same stream."""
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def _arrays(key: str, stats: Mapping[str, TensorStats], histograms: bool, per_channel: bool, bins: int,
            kl: Mapping[Tuple[str, int], float]) -> Dict[str, np.ndarray]:
    names = list(stats)
    meta = {"format": FORMAT, "key": key, "histograms": histograms, "per_channel": per_channel, "bins": bins,
            "tensors": names, "channels": [stats[t].channel_min is not None for t in names],
            "kl_quantized_bins": sorted({q for _, q in kl})}
    out = {"meta": np.array(json.dumps(meta)),
           "range": np.array([[stats[t].min, stats[t].max] for t in names], np.float64).reshape(-1, 2),
           "count": np.array([stats[t].count for t in names], np.int64)}
    if histograms:
        out["hist"] = np.array([stats[t].hist for t in names], np.int64).reshape(len(names), bins)
    for i, t in enumerate(names):
        if stats[t].channel_min is not None:
            out[f"cmin{i}"], out[f"cmax{i}"] = stats[t].channel_min, stats[t].channel_max
    for q in meta["kl_quantized_bins"]:      # NaN: not computed (a tensor the calibration did not ask KL of)
        out[f"kl{q}"] = np.array([kl.get((t, q), np.nan) for t in names], np.float64)
    return out


class Entry:
    """One entry read back: what it holds, and the statistics a request asks for."""

    def __init__(self, path: Path, key: str, bins: int):
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != FORMAT or meta.get("key") != key or meta.get("bins") != bins:
                raise ValueError("its header does not match its name")
            self.histograms, self.per_channel = bool(meta["histograms"]), bool(meta["per_channel"])
            names, channels = list(meta["tensors"]), list(meta["channels"])
            ranges, count = z["range"], z["count"]
            hist = z["hist"] if self.histograms else None
            if ranges.shape != (len(names), 2) or count.shape != (len(names),) or len(channels) != len(names) or \
                    (hist is not None and hist.shape != (len(names), bins)):
                raise ValueError("its arrays do not match its header")
            self.stats = {
                t: TensorStats(float(ranges[i, 0]), float(ranges[i, 1]),
                               z[f"cmin{i}"] if channels[i] else None, z[f"cmax{i}"] if channels[i] else None,
                               hist[i].copy() if hist is not None else None, int(count[i]))
                for i, t in enumerate(names)}
            self.kl: Dict[Tuple[str, int], float] = {}
            for q in meta.get("kl_quantized_bins", []):
                values = z[f"kl{int(q)}"]
                if values.shape != (len(names),):
                    raise ValueError("its KL thresholds do not match its header")
                self.kl.update({(t, int(q)): float(v) for t, v in zip(names, values) if not np.isnan(v)})

    def serves(self, histograms: bool, per_channel: bool) -> bool:
        return (self.histograms or not histograms) and (self.per_channel or not per_channel)


def _narrowed(stats: Mapping[str, TensorStats], histograms: bool, per_channel: bool) -> Dict[str, TensorStats]:
    """What collecting with only these settings gives: no histogram / no channel ranges when not asked for."""
    return {t: TensorStats(s.min, s.max, s.channel_min if per_channel else None, s.channel_max if per_channel else None,
                           s.hist if histograms else None, s.count) for t, s in stats.items()}


def _write(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _evict(root: Path, keep: Path, limit: int) -> None:
    """Remove the least recently used entries (by mtime; a reuse touches its entry) beyond ``limit`` bytes,
    and temporary files older than a day (a conversion killed while writing its entry)."""
    stale = time.time() - 86400
    for p in root.glob(".*.tmp"):
        try:
            if p.stat().st_mtime < stale:
                p.unlink()
        except OSError:
            pass
    entries = []
    for p in root.glob("*.npz"):
        try:
            st = p.stat()
        except OSError:
            continue
        entries.append((p != keep, -st.st_mtime, st.st_size, p))
    total = 0
    for _, _, size, p in sorted(entries):
        total += size
        if total > limit and p != keep:
            try:
                p.unlink()
            except OSError:
                pass


class CachedStatistics:
    """The statistics a request asked for (``stats``), the KL thresholds known for them (``kl``:
    (tensor, kl_quantized_bins) -> threshold) and the entry they live in (None with the cache off)."""

    def __init__(self, stats: Dict[str, TensorStats], kl: Dict[Tuple[str, int], float], path: Optional[Path] = None,
                 key: str = "", full: Optional[Mapping[str, TensorStats]] = None, histograms: bool = False,
                 per_channel: bool = False, bins: int = 0):
        self.stats, self.kl, self.path = stats, kl, path
        self._key, self._full, self._h, self._c, self._bins = key, full, histograms, per_channel, bins

    def save_kl(self, computed: Mapping[Tuple[str, int], float], log: logging.Logger) -> None:
        """Add the KL thresholds a calibration computed to the entry (rewritten whole, atomically)."""
        new = {k: v for k, v in computed.items() if k not in self.kl and k[0] in self.stats}
        if self.path is None or not new or not self._h:
            return
        self.kl.update(new)
        try:
            _write(self.path, _arrays(self._key, self._full, self._h, self._c, self._bins, self.kl))
        except OSError as exc:
            log.warning("calibration statistics not cached: cannot write %s (%s)", self.path, exc)


def cached_statistics(
    model: onnx.ModelProto,
    tensors: Sequence[str],
    samples: Sequence[Sample],
    infos: Mapping[str, TensorInfo],
    bins: int = 2048,
    histograms: bool = True,
    per_channel: bool = True,
    log: Optional[logging.Logger] = None,
    limit: int = LIMIT_BYTES,
) -> CachedStatistics:
    """``collect_statistics``, read from the cache when the same statistics were collected before."""
    log = log or logging.getLogger("bpuemu.host.quant")
    root = cache_dir()
    if root is None:
        return CachedStatistics(collect_statistics(model, tensors, samples, infos, bins, histograms=histograms,
                                                   per_channel=per_channel), {})
    tensors = list(dict.fromkeys(tensors))
    key = statistics_key(model, tensors, samples, infos, bins)
    path = root / f"{key}.npz"
    entry = None
    if path.exists():
        try:
            entry = Entry(path, key, bins)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
            log.warning("calibration statistics cache entry %s is unreadable (%s); computing the statistics again",
                        path, exc)
    if entry is not None and entry.serves(histograms, per_channel):
        try:
            os.utime(path)      # most recently used
        except OSError:
            pass
        log.info("calibration statistics reused from %s (the same model, calibration data and settings as a "
                 "previous conversion; %s=off recomputes them)", path, ENV)
        return CachedStatistics(_narrowed(entry.stats, histograms, per_channel), entry.kl if histograms else {}, path,
                                key, entry.stats, entry.histograms, entry.per_channel, bins)
    # Collect what the request and the old entry need together, so the new entry serves both.
    has_h = histograms or (entry is not None and entry.histograms)
    has_c = per_channel or (entry is not None and entry.per_channel)
    stats = collect_statistics(model, tensors, samples, infos, bins, histograms=has_h, per_channel=has_c)
    kl = dict(entry.kl) if entry is not None and entry.histograms else {}    # the same histograms: still valid
    try:
        _write(path, _arrays(key, stats, has_h, has_c, bins, kl))
        _evict(root, path, limit)
        log.info("calibration statistics stored in %s for the next conversion of this model with this data", path)
    except OSError as exc:
        log.warning("calibration statistics not cached: cannot write %s (%s)", path, exc)
        return CachedStatistics(_narrowed(stats, histograms, per_channel), {})
    return CachedStatistics(_narrowed(stats, histograms, per_channel), kl if histograms else {}, path, key, stats,
                            has_h, has_c, bins)
