"""The cosine table's compiled cosine (bpuemu.host.quant.cosine_kernel) against numpy's."""
import math

import numpy as np
import pytest

from bpuemu.common.compare import cosine_similarity
from bpuemu.host.quant.cosine_kernel import BLOCK, _sums
from bpuemu.host.quant.cosine_kernel import compiled_cosine as cosine


def _exact_sums(x, y):
    """x.x, y.y and x.y correctly rounded (float32 products are exact in float64; fsum is exact)."""
    u, v = x.astype(np.float64), y.astype(np.float64)
    return math.fsum((u * u).tolist()), math.fsum((v * v).tolist()), math.fsum((u * v).tolist())


@pytest.mark.parametrize("n", [1, 7, BLOCK - 1, BLOCK, 3 * BLOCK + 5, 200_003])
def test_sums_are_within_the_bound_of_the_exact_sums(n):
    """Each of the three sums errs by at most (BLOCK + 2) eps of the sum of its terms' magnitudes
    (the module's bound), and on these tensors by no more than numpy's einsum does."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3], n)).astype(np.float32)
    y = (x + 0.05 * rng.standard_normal(n)).astype(np.float32)
    got = _sums(x, y)
    exact = _exact_sums(x, y)
    mags = _exact_sums(np.abs(x), np.abs(y))
    eps = np.finfo(np.float64).eps
    for g, e, m in zip(got, exact, mags):
        assert abs(g - e) <= (BLOCK + 2) * eps * m, (n, g, e)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    theirs = (np.einsum("i,i->", x64, x64), np.einsum("i,i->", y64, y64), np.einsum("i,i->", x64, y64))
    assert sum(abs(g - e) for g, e in zip(got, exact)) <= sum(abs(t - e) for t, e in zip(theirs, exact)) + 4 * eps * sum(mags)


def test_cosine_is_numpys_cosine_with_its_conventions():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 8, 33, 35)).astype(np.float32)
    b = (a + 0.1 * rng.standard_normal(a.shape)).astype(np.float32)
    assert cosine(a, b) == pytest.approx(cosine_similarity(a, b), abs=1e-13)
    assert cosine(a, b) < 0.999
    assert cosine(a, -a) == pytest.approx(-1.0, abs=1e-12)
    z = np.zeros(9, np.float32)
    assert cosine(z, z) == 1.0 and cosine(z, np.ones(9, np.float32)) == 0.0
    # the common prefix of tensors of different sizes
    assert cosine(a.ravel()[:100], b.ravel()[:90]) == pytest.approx(cosine_similarity(a.ravel()[:90], b.ravel()[:90]), abs=1e-13)
    # NaNs skipped (the sums of what is left compiled too), infinities and other dtypes as numpy's cosine has them
    nan = a.ravel().copy()
    nan[::7] = np.nan
    assert cosine(nan, b) == pytest.approx(cosine_similarity(nan, b), abs=1e-13) and math.isfinite(cosine(nan, b))
    inf = a.ravel().copy()
    inf[3] = np.inf
    with np.errstate(invalid="ignore"):
        assert np.array_equal(cosine(inf, b), cosine_similarity(inf, b), equal_nan=True)
    assert cosine(a.astype(np.float64), b) == cosine_similarity(a.astype(np.float64), b)
