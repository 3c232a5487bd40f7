"""The calibration statistics' compiled reductions (bpuemu.host.quant.kernels) count what numpy counts.

The statistics count with the kernels from statistics.COMPILED_FROM bytes of activations on, with
numpy (statistics.numpy_ranges, numpy_histogram) below: every test here holds both to the
reference.

The reference is the numpy formula the statistics used before the kernels (and that
test_quant.py's ``_reference_stats`` still spells out): min/max of the (N, C, rest) view along
axis 2 then 0, and a bin index ``(np.abs(x) * np.float32(bins / absmax)).astype(np.int32)``
clipped to ``bins - 1``, counted with np.bincount. Real activations: every float tensor of
PaddleOCR's direction classifier and PP-OCRv4 det (rapidocr-onnxruntime's wheel, fetched as
test_real_models.py does) on text pages, each sample's own absmax (values on the top edge) and
a wider one. The five artifacts of makertbin are compared with main's by hash in the change's
report; here the statistics themselves, value for value.
"""
import numpy as np
import onnx
import pytest

from bpuemu.common.errors import InvalidInput
from bpuemu.host.onnxgraph import feed_for, open_session, tensor_infos, with_outputs
from bpuemu.host.quant import kernels, statistics
from bpuemu.host.quant.statistics import TensorStats, collect_statistics

from makertbin_helpers import text_image

BINS = 2048


def numpy_ranges(x):
    x = np.asarray(x, np.float32)
    v = x.reshape(x.shape[0], x.shape[1], -1) if x.ndim >= 2 else x.reshape(1, 1, -1)
    cmin, cmax = v.min(axis=2).min(axis=0), v.max(axis=2).max(axis=0)
    return float(cmin.min()), float(cmax.max()), cmin, cmax


def numpy_histogram(x, absmax, bins=BINS):
    idx = (np.abs(np.asarray(x, np.float32).reshape(-1)) * np.float32(bins / absmax)).astype(np.int32)
    return np.bincount(np.minimum(idx, bins - 1), minlength=bins).astype(np.int64)


def assert_same_ranges(x):
    rlo, rhi, rcmin, rcmax = numpy_ranges(x)
    for lo, hi, cmin, cmax in (kernels.ranges(x), statistics.numpy_ranges(x)):
        assert (lo, hi) == (rlo, rhi)
        if np.ndim(x) < 2:                  # no axis 1: no per-channel ranges
            assert cmin is None and cmax is None
            continue
        assert cmin.dtype == rcmin.dtype == np.float32
        assert np.array_equal(cmin, rcmin) and np.array_equal(cmax, rcmax)


def assert_same_histogram(x, absmax):
    reference = numpy_histogram(x, absmax)
    assert np.array_equal(kernels.histogram(x, absmax, BINS), reference)
    assert np.array_equal(statistics.numpy_histogram(x, absmax, BINS), reference)


@pytest.fixture(scope="module")
def activations():
    """name -> list of two samples' float activations (every float tensor), for cls and det 160x160."""
    from bpuemu.host.samples.ocr.models import fetch

    fetched = fetch()
    out = {}
    rng = np.random.default_rng(11)
    for name, (h, w) in {"cls": (48, 192), "det": (160, 160)}.items():
        model = onnx.load(fetched[name])
        infos = tensor_infos(model)
        names = [t for n in model.graph.node for t in n.output if t in infos and infos[t].is_float]
        sess = open_session(with_outputs(model, names, infos))
        runs = []
        for _ in range(2):
            page = text_image(h, w, rng)[..., ::-1].transpose(2, 0, 1)[None].astype(np.float32)
            runs.append(sess.run(names, feed_for(sess, {"x": (page / 255 - 0.5) / 0.5})))
        out[name] = {t: [r[k] for r in runs] for k, t in enumerate(names)}
    return out


@pytest.mark.parametrize("model", ["cls", "det"])
def test_ranges_and_histograms_equal_numpy_on_real_activations(activations, model):
    tensors = activations[model]
    assert len(tensors) > 50
    on_edge = 0
    for t, samples in tensors.items():
        if samples[0].size == 0:
            assert kernels.ranges(samples[0]) is None
            continue
        wide = max(float(np.abs(x).max()) for x in samples) * 1.5
        for x in samples:
            assert_same_ranges(x)
            absmax = float(np.abs(x).max())
            if absmax == 0:
                continue
            on_edge += int(np.count_nonzero(np.abs(x) == absmax))
            for a in (absmax, wide):
                assert_same_histogram(x, a)
    assert on_edge >= 2 * len(tensors)       # every sample's absmax is on the top edge


def test_edge_cases_equal_numpy():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 5, 3 * 2048 + 7)).astype(np.float32)   # several blocks, a remainder of 4
    absmax = float(np.abs(x).max())
    x[0, 1, :4] = [absmax, -absmax, 0.0, -0.0]
    cases = [
        x,
        x.transpose(0, 2, 1),                                   # not contiguous
        x[:, ::2, 1::3],                                        # strided
        x.astype(np.float64), x.astype(np.float16),             # counted as float32, as the statistics always did
        x[0, 0],                                                # one axis: no channels
        np.float32(3.5) * np.ones((1, 1), np.float32),
        np.zeros((1, 4, 3), np.float32),
        -np.zeros((1, 4, 3), np.float32),
        np.full((3, 2, 5), -2.0, np.float32),
        np.array([[1e-40, -3e-39]], np.float32),                # subnormals
        np.array([[np.finfo(np.float32).max, -np.finfo(np.float32).max, 1.0]], np.float32),
    ]
    for c in cases:
        assert_same_ranges(c)
        a = float(np.abs(np.asarray(c, np.float32)).max())
        with np.errstate(over="ignore"):
            counted = a > 0 and np.isfinite(np.float32(BINS / a))
        if counted:
            for scale in (1.0, 1.0000001, 3.0):
                assert_same_histogram(c, a * scale)
    # Without per-channel ranges: the whole tensor's.
    assert kernels.ranges(x, per_channel=False) == (float(x.min()), float(x.max()), None, None)
    assert statistics.numpy_ranges(x, per_channel=False) == (float(x.min()), float(x.max()), None, None)


def test_ranges_find_the_extremes_at_every_part_edge():
    """The ranges kernel reads each row in parts of kernels._AHEAD values (asking for the next part
    while it reads one): a minimum or maximum on a part's first or last value, in a row's last
    short part, or in a row shorter than a part is found, per channel and overall."""
    part = kernels._AHEAD
    rng = np.random.default_rng(4)
    for length in (1, part - 1, part, part + 1, 2 * part + 5):
        for at in sorted({0, part - 1, part, 2 * part - 1, 2 * part, length - 1}):
            if at >= length:
                continue
            x = rng.uniform(-1, 1, (2, 3, length)).astype(np.float32)
            x[1, 1, at], x[0, 2, at] = 5.0, -7.0
            assert_same_ranges(x)
            lo, hi, cmin, cmax = kernels.ranges(x)
            assert (lo, hi, cmax[1], cmin[2]) == (-7.0, 5.0, 5.0, -7.0), (length, at)


def _runs(bins, lengths, rng):
    """Values in ``bins`` (of 2048 over [0, 1]), each repeated ``lengths`` times, random signs."""
    v = (np.asarray(bins, np.float64) + 0.5) / BINS
    x = np.repeat(v, lengths).astype(np.float32)
    return x * rng.choice(np.array([-1, 1], np.float32), x.size)


def test_runs_of_one_bin_are_counted_as_numpy_counts():
    """The histogram kernel counts 16 values in one bin (checked against their previous values'
    bins) with one count of 16, each half of 8 in one bin with one count of 8, other values one by
    one: runs of one bin that line up with the 16s or not, bins changing at a 16's first value or
    at its second half's first (the halves each in one bin, the 16 not), no two neighbours in one
    bin, every tail length past the last 16, and bins on the top edge."""
    rng = np.random.default_rng(3)
    n = 2 * 2048 + 16 * 5
    two = rng.integers(0, BINS, 2)
    patterns = {
        "one bin": _runs([700], [n], rng),
        "16s, each its own bin": _runs(rng.integers(0, BINS, n // 16), 16, rng),
        "16s, one value late": _runs(rng.integers(0, BINS, n // 16 + 1), [1] + [16] * (n // 16), rng),
        "8s, each its own bin": _runs(rng.integers(0, BINS, n // 8), 8, rng),
        "8s, two bins in turn": _runs(np.resize(two, n // 8), 8, rng),
        "two bins in turn": _runs(np.resize(two, n), 1, rng),
        "runs of 1 to 40": _runs(rng.integers(0, 8, 400) * 256 + rng.integers(0, 3, 400), rng.integers(1, 41, 400), rng),
        "zeros and the top edge": np.repeat(np.array([0.0, 1.0, -1.0, -0.0], np.float32), [30, 17, 9, 33]),
    }
    for name, x in patterns.items():
        for tail in range(17):
            c = x[:x.size - 16 + tail] if x.size > 16 else x[:tail]
            for absmax in (1.0, 3.0):
                reference = numpy_histogram(c, absmax)
                assert np.array_equal(kernels.histogram(c, absmax, BINS), reference), (name, tail, absmax)
    assert kernels.histogram(patterns["one bin"], 1.0, BINS)[700] == n


def test_empty_zero_and_tiny_tensors():
    for ranges, histogram in ((kernels.ranges, kernels.histogram), (statistics.numpy_ranges, statistics.numpy_histogram)):
        assert ranges(np.zeros((1, 3, 0), np.float32)) is None
        assert not histogram(np.zeros((0,), np.float32), 1.0, BINS).any()
        # All zero (absmax 0) and an absmax so small that float32(bins / absmax) overflows: bin 0.
        for x, absmax in ((np.zeros((1, 2, 3), np.float32), 0.0), (np.array([1e-45, -1e-45, 0], np.float32), 1e-45)):
            h = histogram(x, absmax, BINS)
            assert h[0] == x.size and h.sum() == x.size
    # Of equal zeros, -0.0 is the smaller: the values numpy gives, with a sign that does not
    # depend on where the zeros are (numpy's does).
    lo, hi, cmin, cmax = kernels.ranges(np.array([[0.0, -0.0], [-0.0, 0.0]], np.float32))
    assert np.signbit(lo) and not np.signbit(hi) and np.signbit(cmin).all() and not np.signbit(cmax).any()


@pytest.mark.parametrize("compiled_from", [0, 1 << 62])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, -np.nan])
def test_a_nan_or_an_infinity_is_refused_naming_the_tensor(monkeypatch, bad, compiled_from):
    monkeypatch.setattr(statistics, "COMPILED_FROM", compiled_from)
    x = np.ones((1, 2, 4, 4), np.float32)
    x[0, 1, 2, 3] = bad
    for ranges in (kernels.ranges, statistics.numpy_ranges):
        lo, hi, _, _ = ranges(x)
        assert not (np.isfinite(lo) and np.isfinite(hi))
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    samples = [{"x": np.ones_like(x)}, {"x": x}]
    with pytest.raises(InvalidInput, match="tensor 'x' has NaN or infinite values on calibration sample 2 of 2"):
        collect_statistics(model, ["x"], samples, tensor_infos(model))
    if np.isnan(bad):   # y = Relu(x) carries the NaN; Relu(-inf) = 0 does not carry an infinity
        with pytest.raises(InvalidInput, match="tensor 'y' has NaN or infinite values on calibration sample 2 of 2"):
            collect_statistics(model, ["y"], samples, tensor_infos(model))


@pytest.mark.parametrize("compiled", [False, True])
def test_tensor_stats_of_one_array_are_the_numpy_ones(compiled):
    x = np.random.default_rng(9).standard_normal((1, 3, 40, 40)).astype(np.float32)
    st = TensorStats.of(x, compiled=compiled)
    lo, hi, cmin, cmax = numpy_ranges(x)
    assert (st.min, st.max) == (lo, hi) and np.array_equal(st.channel_min, cmin) and np.array_equal(st.channel_max, cmax)
    assert np.array_equal(st.hist, numpy_histogram(x, max(abs(lo), abs(hi)))) and st.count == x.size


@pytest.mark.parametrize("name", ["sample", "cls", "det"])
def test_artifacts_are_those_of_the_numpy_statistics(tmp_path, monkeypatch, name):
    """makertbin (calibration_type default, 20 samples, statistics cache off) writes the same five
    files byte for byte, and the same cosine table, with the kernels counting every statistic
    (COMPILED_FROM 0) as with numpy counting them (the formulas main used before the kernels)."""
    from bpuemu.host.mapper.makertbin import makertbin_from_config
    from bpuemu.host.samples.ocr.models import fetch

    from real_models import MODELS, project_config

    monkeypatch.setenv("BPUEMU_CALIBRATION_CACHE", "off")
    cfg = project_config(tmp_path, {m: p for m, p in fetch().items() if m in MODELS}, name)
    files, cosines, calls = [], [], []
    original = kernels.histogram

    def counting(*a, **k):
        calls[-1] += 1
        return original(*a, **k)

    monkeypatch.setattr(kernels, "histogram", counting)
    for compiled_from in (0, 1 << 62):
        monkeypatch.setattr(statistics, "COMPILED_FROM", compiled_from)
        calls.append(0)
        art = makertbin_from_config(cfg)
        paths = [art.original, art.optimized, art.calibrated, art.quantized, art.bin]
        files.append([open(p, "rb").read() for p in paths])
        cosines.append((art.cosines, art.output_cosines))
    assert calls[0] > 0 and calls[1] == 0, calls
    for p, a, b in zip(paths, *files):
        assert a == b, f"{p} differs"
    assert cosines[0] == cosines[1]


def test_the_kernels_compile_once_per_machine(tmp_path):
    """The first process compiles the kernels and keeps them in numba's cache (here a fresh
    NUMBA_CACHE_DIR: where they go without it, beside the module or in ~/.cache/numba, is numba's
    choice); the next process reads them from there instead of compiling."""
    import os
    import subprocess
    import sys

    script = ("import numpy as np\n"
              "from bpuemu.host.quant import kernels\n"
              "x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)\n"
              "kernels.ranges(x); kernels.histogram(x, 23.0, 2048)\n"
              "print(sum(len(f.stats.cache_hits) for f in (kernels._range_keys, kernels._count)),\n"
              "      sum(len(f.stats.cache_misses) for f in (kernels._range_keys, kernels._count)))\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    (hits1, misses1), (hits2, misses2) = (map(int, r.stdout.split()) for r in runs)
    assert (hits1, misses1) == (0, 2) and (hits2, misses2) == (2, 0)
    assert any(f.suffix == ".nbc" for f in (tmp_path / "numba").rglob("*"))


def test_makertbin_with_a_nan_in_the_calibration_data_is_one_error_line(tmp_path):
    """A float32 calibration file holding a NaN (a featuremap input, no preprocessing): makertbin ends
    with one ERROR line naming the first tensor that carries it and the sample, and a non-zero exit
    (numpy's histogram used to end in a ValueError from np.bincount)."""
    from makertbin_helpers import sample_float_model, write_cal_dir, write_config
    from helpers.console import assert_one_clear_error, run

    onnx.save(sample_float_model(16, 16, image_input=False, seed=0), str(tmp_path / "f.onnx"))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    arrays[2][0, 1, 3, 4] = np.nan
    config = write_config(str(tmp_path / "c.yaml"), str(tmp_path / "f.onnx"), "m", str(tmp_path / "out"), {"data": {
        "input_type_train": "featuremap", "input_layout_train": "NCHW", "input_type_rt": "featuremap",
        "input_layout_rt": "NCHW", "norm_type": "no_preprocess", "input_shape": "1x3x16x16",
        "cal_data_dir": write_cal_dir(str(tmp_path / "cal"), arrays), "cal_data_type": "float32"}})
    code, text = run("hb_mapper", "makertbin", "--config", config, "--model-type", "onnx", cwd=tmp_path)
    assert_one_clear_error(code, text, "has NaN or infinite values on calibration sample 3 of 4")


def test_small_statistics_are_counted_without_numba():
    """Below COMPILED_FROM (the sample CNN, PP-OCR cls, det 160) numpy counts: a conversion does not
    pay numba's import and first call (about 0.7 s); from it on, the kernels count."""
    import subprocess
    import sys

    script = """
import sys
import numpy as np
from onnx import TensorProto, helper
from bpuemu.host.onnxgraph import tensor_infos
from bpuemu.host.quant import statistics
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
samples = [{"x": np.random.default_rng(i).standard_normal((1, 2, 8, 8)).astype(np.float32)} for i in range(3)]
small = statistics.collect_statistics(model, ["y"], samples, tensor_infos(model))
print("numba" in sys.modules)
statistics.COMPILED_FROM = 3 * 2 * 8 * 8 * 4          # exactly these samples' bytes
big = statistics.collect_statistics(model, ["y"], samples, tensor_infos(model))
print("numba" in sys.modules, np.array_equal(small["y"].hist, big["y"].hist), small["y"].max == big["y"].max)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "True", "True"], proc.stdout


def test_the_kernels_run_where_numba_has_nowhere_to_keep_them():
    """A read-only install and no writable home: numba refuses cache=True at import ("no locator
    available"); the kernels (the statistics' and the cosine table's) are then compiled in the
    process and count the same."""
    import subprocess
    import sys

    script = """
from numba.core import caching
caching.CacheImpl._locator_classes = []           # no place numba could write its cache to
import numpy as np
from bpuemu.host.quant import kernels
x = np.arange(-12, 12, dtype=np.float32).reshape(2, 3, 4)
r = kernels.ranges(x)
h = kernels.histogram(x, 12.0, 2048)
print(r[0], r[1], int(h.sum()), int(h[2047]), int(h[0]), type(kernels._count._cache).__name__)
from bpuemu.host.quant import cosine_kernel
print(round(cosine_kernel.compiled_cosine(x, -x), 6), type(cosine_kernel._sums._cache).__name__)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["-12.0", "11.0", "24", "1", "1", "NullCache", "-1.0", "NullCache"], proc.stdout
