"""Fixtures of the fuzz tests: the CI hypothesis profile and small sample models."""
import os
import sys

import pytest
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))
import fuzzing  # noqa: E402,F401  (registers the bpuemu-ci profile)

settings.load_profile("bpuemu-ci")


@pytest.fixture(scope="session")
def sample_bins(tmp_path_factory):
    """input_type_rt -> path of a 16x16 sample `.bin`."""
    from bpuemu.host.samples import sample_bin

    d = tmp_path_factory.mktemp("fuzz_models")
    out = {}
    for kind in ("rgb", "nv12", "featuremap"):
        out[kind] = str(d / f"sample_{kind}.bin")
        sample_bin(out[kind], input_type_rt=kind, height=16, width=16)
    return out
