"""Shared pytest fixtures for the bpuemu test suite.

Keep this file small: model builders live in ``tests/helpers/``; each section
below belongs to one area of the suite. A test that needs a tool CI installs
(sshd, chromium, systemd-analyze, the arm64 chroot) asks for it through
``helpers.installed.require``: a skip here, a failure under CI=true.
"""
import os
import shutil
import tempfile

import numpy as np
import pytest


# --- the calibration statistics cache (host/quant/statcache.py) ---------------------
# No test reuses statistics another test (or the user's own conversions) computed: a hit would defeat
# the tests that compare 1 vs 2 workers or one search against another. Session fixtures get one
# fresh directory for the run, each test its own; subprocesses inherit the variable.

_SESSION_CACHE = None


def pytest_configure(config):
    global _SESSION_CACHE
    _SESSION_CACHE = tempfile.mkdtemp(prefix="bpuemu-calibration-cache-")
    os.environ["BPUEMU_CALIBRATION_CACHE"] = _SESSION_CACHE


def pytest_unconfigure(config):
    if _SESSION_CACHE:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def calibration_cache(tmp_path, monkeypatch):
    """This test's own calibration statistics cache directory (created on first store)."""
    path = tmp_path / "calibration-cache"
    monkeypatch.setenv("BPUEMU_CALIBRATION_CACHE", str(path))
    return path


# --- running on both cores (pytest-xdist: scripts/test.sh runs -n 2 --dist loadgroup) --------
# Each module below runs on one worker, its tests one after the other, never beside another test of its
# group: those that hold deadlines and time frames or calls against a bound, and those that start
# several daemons or subprocess trees at once (they would otherwise double the machine's load).

SERIAL_GROUPS = {
    "timing": ("board/test_security.py", "board/test_faults.py", "board/test_x5_pacing.py",
               "board/test_data_channel.py", "board/test_data_channel_buffers.py", "board/test_memory.py",
               "board/test_metrics.py", "board/test_daemon.py", "host/test_ssh_faults.py",
               "common/test_x5_schedule.py", "test_bench_load.py", "test_bench_rerun_ab.py", "test_bench_soak.py",
               "board/test_attacks.py"),
    # The arm64 board root is built once (debootstrap under qemu, minutes): its tests hold one worker alone.
    "arm64": ("deploy/test_install_arm64.py",),
    "daemons": ("board/test_farm.py", "host/test_ocr_eval.py", "host/test_verifier.py", "host/test_ssh.py",
                "deploy/test_compose.py", "install/test_installed_product.py",
                "test_docs.py", "board/test_network.py", "board/test_upload_resume.py", "host/test_network_farm.py"),
}
_GROUP_OF = {module: group for group, modules in SERIAL_GROUPS.items() for module in modules}
_TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _GROUP_OF.get(os.path.relpath(str(item.path), _TESTS).replace(os.sep, "/"))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under --dist loadgroup every grouped test must reach the scheduler with its group (its node id ends
    in @group). pytest 9.2's node ids broke that silently (pytest-xdist issue 1386): stop the run rather
    than time tests side by side."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    lost = [i for i in ids if i.split("::")[0].replace("tests/", "", 1) in _GROUP_OF and "@" not in i]
    if lost:
        pytest.exit(f"--dist loadgroup lost the xdist_group of {len(lost)} test(s), e.g. {lost[0]}: this pytest "
                    "and pytest-xdist do not group tests (pyproject.toml's test extra pins pytest < 9.2)", returncode=4)


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
