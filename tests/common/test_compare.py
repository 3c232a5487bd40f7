"""The compare metrics hb_verifier prints (bpuemu.common.compare), on hand-made tensors."""
import numpy as np
import pytest

from bpuemu.common.compare import (
    agreement_rate,
    broadcast_scale,
    compare_tensors,
    cosine_similarity,
    count_mismatch,
    first_divergence,
    lsb_distance,
    max_abs_error,
    mse,
)


def test_identical_tensors_pass_with_zero_error():
    a = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    c = compare_tensors(a, a.copy(), "x", "x")
    assert c.passed and c.mismatch.total == 0 and c.total == 24
    assert c.max_abs_error == 0 and c.mse == 0 and c.cosine == pytest.approx(1.0)
    assert c.mismatch_rate == 0 and c.relative_mismatch_ratio == 0
    assert c.max_lsb_error is None  # a float tensor without a scale


def test_digits_compare_values_rounded_to_n_places():
    a = np.array([0.123454, 1.0, 2.0], dtype=np.float64)
    b = np.array([0.123449, 1.0, 2.0000001], dtype=np.float64)
    # 5 places: 0.12345 == 0.12345 and 2.00000 == 2.00000
    assert count_mismatch(a, b, digits=5).line_diff == 0
    # 6 places: 0.123454 != 0.123449; 2.000000 == 2.000000
    assert count_mismatch(a, b, digits=6).line_diff == 1
    # 7 places: the 1e-7 difference shows too
    assert count_mismatch(a, b, digits=7).line_diff == 2


def test_relative_ratio_and_max_abs_error_over_differing_values():
    a = np.array([1.0, 2.0, 4.0, 0.0])
    b = np.array([1.0, 2.5, 3.0, 0.5])
    c = compare_tensors(a, b, digits=3)
    assert c.mismatch.line_diff == 3 and c.mismatch_rate == pytest.approx(0.75)
    assert c.max_abs_error == pytest.approx(1.0)
    # |a-b| / max(|a|,|b|): 0.5/2.5, 1/4, 0.5/0.5 -> the largest is 1.0 (zero against 0.5)
    assert c.relative_mismatch_ratio == pytest.approx(1.0)
    assert not c.passed


def test_line_miss_counts_values_one_side_lacks():
    a = np.arange(10, dtype=np.float32)
    b = np.arange(7, dtype=np.float32)
    c = compare_tensors(a, b)
    assert c.mismatch.line_miss == 3 and c.mismatch.line_diff == 0 and c.total == 10
    assert c.mismatch_rate == pytest.approx(0.3) and not c.passed


def test_line_nan_counts_positions_where_either_side_is_nan():
    a = np.array([1.0, np.nan, 3.0, np.nan])
    b = np.array([1.0, 2.0, np.nan, np.nan])
    c = compare_tensors(a, b)
    assert c.mismatch.line_nan == 3 and c.mismatch.line_diff == 0 and c.mismatch.total == 3
    assert c.max_abs_error == 0  # NaNs are counted, not measured


def test_integer_tensors_compare_exactly_with_an_lsb_of_one():
    a = np.array([[-128, 0, 5, 127]], dtype=np.int8)
    b = np.array([[-128, 1, 5, 125]], dtype=np.int8)
    c = compare_tensors(a, b, digits=5)
    assert c.mismatch.line_diff == 2 and c.max_lsb_error == 2 and c.scale == [1.0]
    assert compare_tensors(a, b, lsb=2).passed
    assert not compare_tensors(a, b, lsb=1).passed


def test_labels_report_the_agreement_rate_not_a_cosine_of_indices():
    a = np.array([[0, 3, 7, 7]], dtype=np.int64)
    b = np.array([[0, 4, 7, 1]], dtype=np.int64)
    assert agreement_rate(a, b) == 0.5
    assert agreement_rate(a, b[:, :2]) == 0.25          # values one side lacks disagree
    assert agreement_rate(np.array([]), np.array([])) == 1.0
    c = compare_tensors(a, b, labels=True)
    assert c.agreement == 0.5 and c.to_dict()["agreement"] == 0.5
    assert compare_tensors(a, b).agreement is None       # raw quantized values keep the cosine


def test_lsb_tolerance_in_steps_of_a_per_tensor_scale():
    scale = 0.05
    q = np.arange(-20, 20, dtype=np.int32)
    a = (q * scale).astype(np.float32)
    b = ((q + (q % 3 == 0)) * scale).astype(np.float32)  # every third value one step off
    c = compare_tensors(a, b, scale=[scale])
    assert not c.passed and c.max_lsb_error == pytest.approx(1.0, abs=1e-4)
    assert compare_tensors(a, b, scale=[scale], lsb=1).passed
    assert not compare_tensors(a, b, scale=[scale], lsb=0.5).passed
    assert compare_tensors(a, b, scale=[scale], lsb=1).lsb_tolerance == 1


def test_lsb_per_channel_scale_broadcasts_on_its_axis():
    scales = [0.1, 1.0]
    a = np.zeros((1, 2, 3), dtype=np.float32)
    b = a.copy()
    b[0, 0, :] = 0.1  # one step of channel 0
    b[0, 1, :] = 0.5  # half a step of channel 1
    d = lsb_distance(a, b, scales, axis=1)
    assert np.allclose(d[0, 0], 1.0) and np.allclose(d[0, 1], 0.5)
    assert compare_tensors(a, b, scale=scales, axis=1, lsb=1).passed
    c = compare_tensors(a, b, scale=scales, axis=1, lsb=0.75)
    assert c.mismatch.line_diff == 3  # the channel-0 values
    with pytest.raises(ValueError, match="do not fit"):
        broadcast_scale(scales, (1, 3, 2), axis=1)


def test_cosine_mse_and_blank_tensors():
    a = np.array([1.0, 0.0])
    b = np.array([0.0, 1.0])
    assert cosine_similarity(a, b) == pytest.approx(0.0)
    assert cosine_similarity(a, -a) == pytest.approx(-1.0)
    assert cosine_similarity(np.zeros(3), np.zeros(3)) == 1.0
    assert cosine_similarity(np.zeros(3), np.ones(3)) == 0.0  # by definition, not an average hiding it
    assert mse(a, b) == pytest.approx(1.0)
    assert max_abs_error(a, b) == pytest.approx(1.0)


def test_first_divergence_follows_the_given_order():
    order = ["in", "conv1", "conv2", "out"]
    a = {"in": np.ones(4), "conv1": np.ones(4), "conv2": np.ones(4), "out": np.ones(4)}
    b = {"in": np.ones(4), "conv1": np.ones(4), "conv2": np.full(4, 2.0), "out": np.full(4, 3.0)}
    d = first_divergence(order, a, b)
    assert d is not None and d.tensor == "conv2" and d.index == 2 and d.comparison.mismatch.line_diff == 4
    b["conv2"] = np.ones(4)
    assert first_divergence(order, a, b).tensor == "out"
    assert first_divergence(["in", "conv1"], a, b) is None
    del b["out"]  # only tensors both sides hold are compared
    assert first_divergence(order, a, b) is None


def test_debugger_metrics_on_known_values():
    from bpuemu.common.compare import METRICS, SQNR_IDENTICAL_DB, chebyshev, mre, sqnr

    a = np.array([1.0, -2.0, 3.0, 0.0])
    b = np.array([1.5, -2.0, 2.0, 0.5])
    assert mre(a, b) == pytest.approx((0.5 + 0 + 1 + 0.5) / 6)
    assert sqnr(a, b) == pytest.approx(10 * np.log10(14 / 1.5))
    assert chebyshev(a, b) == 1.0
    assert sqnr(a, a) == SQNR_IDENTICAL_DB and mre(a, a) == 0.0
    assert mre(np.zeros(3), np.ones(3)) == float("inf")
    assert set(METRICS) == {"cosine-similarity", "mse", "mre", "sqnr", "chebyshev"}
    # worst first: low cosine / sqnr, high mse / mre / chebyshev
    vals = {"x": 0.9, "y": 0.5, "z": 0.99}
    assert METRICS["cosine-similarity"].worst_first(vals) == ["y", "x", "z"]
    assert METRICS["mse"].worst_first(vals) == ["z", "x", "y"]


def test_cosine_skips_the_positions_where_either_side_is_nan():
    """cosine_similarity sums first and looks for NaNs only when a sum is NaN: the result equals the
    cosine of the pairs without a NaN (either side), and a NaN-free pair is not masked at all."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    keep = np.ones(1000, bool)
    keep[[3, 500]] = False
    a2, b2 = a.copy(), b.copy()
    a2[3], b2[500] = np.nan, np.nan
    assert cosine_similarity(a2, b2) == cosine_similarity(a[keep], b[keep])
    assert not np.isnan(cosine_similarity(a2, b2)) and cosine_similarity(a2, b2) != cosine_similarity(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert cosine_similarity(a, b) == pytest.approx(a64 @ b64 / np.sqrt((a64 @ a64) * (b64 @ b64)), abs=1e-12)
    assert np.isnan(cosine_similarity(np.array([np.inf, 1.0]), np.array([0.0, 1.0])))   # inf * 0: no NaN to skip
