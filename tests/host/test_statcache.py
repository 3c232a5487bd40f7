"""The calibration statistics cache (bpuemu.host.quant.statcache): a re-conversion of the same model on the
same calibration data reads the statistics instead of computing them, with byte-identical artifacts.

Each test has its own cache directory (the autouse ``calibration_cache`` fixture in tests/conftest.py).
The artifacts with a reuse are compared on PP-OCR cls in test_real_models.py.
"""
import logging
import os
import re

import numpy as np
import onnx
import pytest

from bpuemu.host.mapper.makertbin import makertbin_from_config
from bpuemu.host.quant import statcache
from bpuemu.host.quant.statistics import StatisticsCollector, collect_statistics
from bpuemu.host.samples import write_sample_project

import quant_models as QM

STORED = re.compile(r"calibration statistics stored in (\S+\.npz)")
REUSED = re.compile(r"calibration statistics reused from (\S+\.npz)")


@pytest.fixture
def passes(monkeypatch):
    """How many times the statistics were collected (StatisticsCollector.collect_data calls)."""
    calls = []
    original = StatisticsCollector.collect_data

    def counting(self, samples):
        calls.append(len(self.tensors))
        return original(self, samples)

    monkeypatch.setattr(StatisticsCollector, "collect_data", counting)
    return calls


def convert(cfg, caplog):
    """makertbin on ``cfg``: the five artifacts' bytes and this run's log text."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        art = makertbin_from_config(cfg)
    files = [open(p, "rb").read() for p in (art.original, art.optimized, art.calibrated, art.quantized, art.bin)]
    return files, caplog.text


def one(pattern, text):
    found = pattern.findall(text)
    assert len(found) == 1, text
    return found[0]


@pytest.fixture
def kl_computed(monkeypatch):
    """The tensors whose KL threshold was computed (not read from the cache)."""
    from bpuemu.host.quant import calibrators

    computed = []
    original = calibrators.THRESHOLD_METHODS["kl"]

    def counting(stats, **kw):
        computed.append(stats)
        return original(stats, **kw)

    monkeypatch.setitem(calibrators.THRESHOLD_METHODS, "kl", counting)
    return computed


@pytest.fixture
def project(tmp_path):
    return write_sample_project(str(tmp_path / "sample"), 32, "rgb", samples=6)


def test_second_conversion_reuses_the_statistics_with_identical_artifacts(project, caplog, passes, kl_computed,
                                                                         calibration_cache):
    first, log1 = convert(project, caplog)
    stored = one(STORED, log1)
    assert not REUSED.search(log1) and os.path.dirname(stored) == str(calibration_cache) and len(passes) == 1
    assert kl_computed, "the default search computes KL thresholds"
    kl_computed.clear()
    second, log2 = convert(project, caplog)
    assert one(REUSED, log2) == stored and not STORED.search(log2)
    assert len(passes) == 1, "the second conversion collected statistics again"
    assert kl_computed == [], "the second conversion computed KL thresholds the entry holds"
    assert second == first


def test_changed_calibration_data_or_model_misses(project, caplog, passes, tmp_path):
    first, log1 = convert(project, caplog)
    entry = one(STORED, log1)
    # One byte of one calibration file: a new entry, computed again.
    cal = tmp_path / "sample" / "calibration_data_rgb"
    path = sorted(cal.iterdir())[3]
    data = bytearray(path.read_bytes())
    data[100] ^= 0x40
    path.write_bytes(bytes(data))
    _, log2 = convert(project, caplog)
    assert not REUSED.search(log2) and one(STORED, log2) != entry and len(passes) == 2
    path.write_bytes(bytes(data[:100]) + bytes([data[100] ^ 0x40]) + bytes(data[101:]))  # back as it was
    # One weight of the model: a miss too.
    onnx_path = tmp_path / "sample" / "sample_float.onnx"
    model = onnx.load(str(onnx_path))
    w = next(i for i in model.graph.initializer if len(onnx.numpy_helper.to_array(i).shape) == 4)
    value = onnx.numpy_helper.to_array(w).copy()
    value.flat[0] += 0.25
    w.CopyFrom(onnx.numpy_helper.from_array(value, w.name))
    onnx.save(model, str(onnx_path))
    _, log3 = convert(project, caplog)
    assert not REUSED.search(log3) and one(STORED, log3) not in (entry, one(STORED, log2)) and len(passes) == 3


def test_corrupt_entry_is_reported_once_and_recomputed(project, caplog, passes):
    first, log1 = convert(project, caplog)
    entry = one(STORED, log1)
    with open(entry, "r+b") as f:     # a torn write or a disk error: the zip's directory is gone
        f.truncate(os.path.getsize(entry) // 2)
    second, log2 = convert(project, caplog)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "calibration statistics" in r.getMessage()]
    assert len(warnings) == 1 and entry in warnings[0].getMessage() and "unreadable" in warnings[0].getMessage()
    assert one(STORED, log2) == entry and len(passes) == 2 and second == first
    third, log3 = convert(project, caplog)        # the replaced entry is good again
    assert one(REUSED, log3) == entry and len(passes) == 2 and third == first


def test_off_switch_default_location_and_an_unwritable_cache(project, caplog, passes, monkeypatch, tmp_path):
    monkeypatch.setenv(statcache.ENV, "off")
    first, log1 = convert(project, caplog)
    second, log2 = convert(project, caplog)
    assert not STORED.search(log1 + log2) and not REUSED.search(log1 + log2) and len(passes) == 2
    assert second == first
    # Unset: $XDG_CACHE_HOME/bpuemu/calibration.
    monkeypatch.delenv(statcache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    third, log3 = convert(project, caplog)
    assert os.path.dirname(one(STORED, log3)) == str(tmp_path / "xdg" / "bpuemu" / "calibration")
    assert third == first
    # A cache that cannot be written (here a file where the directory should be) costs only the reuse.
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv(statcache.ENV, str(tmp_path / "not-a-dir"))
    fourth, log4 = convert(project, caplog)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "calibration statistics" in r.getMessage()]
    assert len(warnings) == 1 and "not cached: cannot write" in warnings[0] and fourth == first


def test_fuller_entry_serves_a_narrower_request_and_a_wider_one_replaces_it(caplog, passes, calibration_cache):
    """What is read back is exactly what collect_statistics gives with the request's settings."""
    from bpuemu.host.quant.marking import build_plan
    from bpuemu.host.quant.options import QuantOptions
    from bpuemu.host.quant.api import _prepare

    m = QM.zoo_model()
    samples = QM.featuremaps(m, 4, seed=1)
    base = _prepare(m, QuantOptions())[0]
    plan = build_plan(base, {n.name for n in base.graph.node}, (), QuantOptions(), logging.getLogger("test"))
    tensors = plan.stat_tensors()

    def same(a, b):
        assert list(a) == list(b)
        for t in a:
            x, y = a[t], b[t]
            assert (x.min, x.max, x.count) == (y.min, y.max, y.count)
            for u, v in ((x.hist, y.hist), (x.channel_min, y.channel_min), (x.channel_max, y.channel_max)):
                assert (u is None) == (v is None) and (u is None or (u.dtype == v.dtype and np.array_equal(u, v)))

    def entry(h, c):
        return statcache.cached_statistics(plan.model, tensors, samples, plan.infos, histograms=h, per_channel=c)

    def cached(h, c):
        return entry(h, c).stats

    with caplog.at_level(logging.INFO):
        first = entry(True, False)                                       # stored: histograms, no channel ranges
        hists = first.stats
        first.save_kl({(tensors[0], 128): 0.25}, logging.getLogger("test"))   # a KL threshold derived from them
        assert len(passes) == 1
        channels = cached(False, True)    # needs channel ranges: computed again with the histograms too, replaces
        assert len(passes) == 2 and len(list(calibration_cache.glob("*.npz"))) == 1
        for h, c in ((False, False), (True, False), (False, True), (True, True)):
            same(cached(h, c), collect_statistics(plan.model, tensors, samples, plan.infos, histograms=h, per_channel=c))
        assert entry(True, True).kl == {(tensors[0], 128): 0.25}        # kept through the replacement
    assert len(passes) == 2 + 4                                          # the four reads collected nothing
    same(hists, collect_statistics(plan.model, tensors, samples, plan.infos, histograms=True, per_channel=False))
    same(channels, collect_statistics(plan.model, tensors, samples, plan.infos, histograms=False, per_channel=True))
    assert any(s.hist is not None for s in hists.values()) and any(s.channel_min is not None for s in channels.values())


def test_the_least_recently_used_entries_go_beyond_the_size_bound(calibration_cache):
    from bpuemu.host.onnxgraph import tensor_infos

    model = QM.zoo_model()
    infos = tensor_infos(model)
    tensors = [model.graph.input[0].name]
    data = [QM.featuremaps(model, 1, seed=s) for s in range(4)]
    for d in data:
        statcache.cached_statistics(model, tensors, d, infos)
    entries = sorted(calibration_cache.glob("*.npz"), key=os.path.getmtime)
    assert len(entries) == 4
    size = max(os.path.getsize(p) for p in entries)
    os.utime(entries[0])            # the oldest was just used: it stays, the next oldest goes
    killed, writing = calibration_cache / ".killed.x.tmp", calibration_cache / ".writing.x.tmp"
    killed.write_bytes(b"half an entry")
    writing.write_bytes(b"half an entry")
    os.utime(killed, (0, 2 * 86400))         # a conversion killed while writing, days ago: removed
    statcache.cached_statistics(model, tensors, QM.featuremaps(model, 1, seed=9), infos, limit=4 * size)
    left = set(calibration_cache.glob("*.npz"))
    assert len(left) == 4 and entries[0] in left and entries[1] not in left
    assert list(calibration_cache.glob(".*.tmp")) == [writing]   # another conversion's, being written now: kept


def test_every_test_has_its_own_cache_directory(tmp_path):
    """tests/conftest.py's autouse fixture: no test reuses statistics another test computed (this test asks for no fixture)."""
    assert os.environ[statcache.ENV] == str(tmp_path / "calibration-cache")


def test_kl_thresholds_read_back_give_the_same_kl_calibration(project, caplog, kl_computed):
    """calibration_type kl uses the KL thresholds as they are: read back from the entry, the artifacts are
    byte-identical to the conversion that computed them."""
    import yaml

    with open(project) as f:
        doc = yaml.safe_load(f)
    doc["calibration_parameters"]["calibration_type"] = "kl"
    with open(project, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    first, _ = convert(project, caplog)
    assert kl_computed
    kl_computed.clear()
    second, log2 = convert(project, caplog)
    assert REUSED.search(log2) and kl_computed == [] and second == first
