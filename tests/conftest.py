"""Shared pytest fixtures for the bpuemu test suite.

Keep this file small: model builders live in ``tests/helpers/``; each section
below belongs to one area of the suite. A test that needs a tool CI installs
(sshd, chromium, systemd-analyze, the arm64 chroot) asks for it through
``helpers.installed.require``: a skip here, a failure under CI=true.
"""
import numpy as np
import pytest


# --- runtime / compiler fixtures (tests/common, tests/board, tests/host) ------------
# Session-scoped where building is involved, so quantize + compile happen once.

@pytest.fixture
def rng():
    """A seeded generator: every run of the suite sees the same data."""
    return np.random.default_rng(1234)


@pytest.fixture(scope="session", params=[True, False], ids=["per_channel", "per_tensor"])
def cpu_middle(request, tmp_path_factory):
    """Conv -> Softmax (CPU) -> Conv, quantized (QDQ, QInt8), compiled and written to a `.bin`."""
    from helpers import models  # lazy: onnx is a host-only package

    return models.build_case(
        tmp_path_factory.mktemp("cpu_middle"), models.cpu_middle_model(), "cpu_middle", per_channel=request.param
    )
