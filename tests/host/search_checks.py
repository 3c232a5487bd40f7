"""Checks on the default calibration search shared by the quantization tests."""
import numpy as np


def assert_same_choice(lazy, full, evaluation_samples):
    """``lazy`` and ``full``: the results (QuantParams or search.SearchResult) of the default search as
    it runs and exhaustive. The choice and every parameter are the exhaustive search's; a candidate scored on every sample
    has the exhaustive score to the last digit, one left early has a bound at or above it and below
    the winner's score."""
    assert (lazy.method, lazy.per_channel, lazy.asymmetric) == (full.method, full.per_channel, full.asymmetric)
    mine_acts, full_acts = (getattr(r, "activations", None) or r.acts for r in (lazy, full))   # QuantParams, SearchResult
    assert mine_acts.keys() == full_acts.keys()
    for t, q in full_acts.items():
        mine = mine_acts[t]
        assert np.array_equal(mine.scale, q.scale) and np.array_equal(mine.zero_point, q.zero_point), t
        assert np.array_equal(mine.threshold, q.threshold) and mine.axis == q.axis, t
    assert [c.name for c in lazy.candidates] == [c.name for c in full.candidates]
    best = max(range(len(full.candidates)), key=lambda k: full.candidates[k].cosine)   # the first of equals
    top = full.candidates[best].cosine
    for k, (mine, ref) in enumerate(zip(lazy.candidates, full.candidates)):
        if mine.samples == evaluation_samples:
            assert (mine.cosine, mine.per_output) == (ref.cosine, ref.per_output), mine.name
        else:
            assert 0 < mine.samples < evaluation_samples and mine.per_output == {}, mine.name
            assert ref.cosine <= mine.cosine, mine.name                   # a bound of its score
            assert mine.cosine < top or (mine.cosine == top and k > best), mine.name   # that rules it out
