"""Fixtures of the board integration tests: sample `.bin` models and real hrt_boardd processes.

Sample models are built once per session (32x32, so they are quick to build
and run). Each test module shares one daemon (``board``); tests that need a
daemon with other flags start their own with ``start_daemon``. Every daemon is
stopped with SIGTERM and must exit 0 without a traceback in its log: that is
the graceful-shutdown check, made on every daemon the tests start.
"""
import os
from dataclasses import dataclass

import numpy as np
import pytest

from bpuemu.common.container import read_bin
from bpuemu.common.input_types import random_rt_input
from bpuemu.common.proto import model_pb2

from boardd_harness import Daemon

SAMPLE_SIZE = 32
SAMPLE_TYPES = ("rgb", "nv12", "featuremap")


@dataclass
class SampleModel:
    """A sample `.bin` and one deterministic input for it, in input_type_rt form."""

    input_type_rt: str
    path: str
    sha256: str
    model: model_pb2.Model
    x: np.ndarray

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def spec(self) -> model_pb2.InputSpec:
        return self.model.input_specs[0]


@pytest.fixture(scope="session")
def sample_models(tmp_path_factory):
    """input_type_rt -> SampleModel, for rgb, nv12 and featuremap inputs."""
    from bpuemu.host.samples import sample_bin

    directory = tmp_path_factory.mktemp("board_samples")
    models = {}
    for i, kind in enumerate(SAMPLE_TYPES):
        path = os.path.join(directory, f"sample_{kind}.bin")
        sha = sample_bin(path, input_type_rt=kind, height=SAMPLE_SIZE, width=SAMPLE_SIZE)
        model = read_bin(path).model()
        x = random_rt_input(model.input_specs[0], np.random.default_rng(100 + i))
        models[kind] = SampleModel(kind, path, sha, model, x)
    assert len({m.sha256 for m in models.values()}) == len(models)
    return models


@pytest.fixture(scope="session")
def rgb_model(sample_models) -> SampleModel:
    return sample_models["rgb"]


def _stop_checked(daemon: Daemon) -> None:
    code = daemon.stop()
    log = daemon.log()
    assert code == 0, f"hrt_boardd exited {code} on SIGTERM (graceful shutdown failed):\n{log}"
    assert "shutting down" in log, log
    assert "Traceback" not in log, f"hrt_boardd logged a traceback:\n{log}"


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """One hrt_boardd per test module, on a free loopback port."""
    daemon = Daemon(tmp_path_factory.mktemp("hrt_boardd"))
    daemon.start()
    try:
        yield daemon
    finally:
        _stop_checked(daemon)


@pytest.fixture
def start_daemon(tmp_path_factory):
    """Start a dedicated hrt_boardd with extra flags: ``start_daemon("--max-jobs", "1")``.

    ``tls``: the client-side TlsConfig the harness uses to reach a TLS daemon.
    """
    started = []

    def start(*extra_args, env=None, tls=None) -> Daemon:
        daemon = Daemon(tmp_path_factory.mktemp("hrt_boardd_dedicated"), *extra_args, env=env, tls=tls)
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        if daemon.proc is not None and daemon.proc.returncode is None:
            _stop_checked(daemon)


@pytest.fixture
def scratch(tmp_path):
    """A working directory for CLI runs (their default --dump_path is '.')."""
    d = tmp_path / "cwd"
    d.mkdir()
    return d


@pytest.fixture(scope="session")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("token") / "board.token"
    path.write_text("s3cret-token-for-the-board-0123456789\n")
    path.chmod(0o600)  # private, as hrt_boardd expects of a token file (else it warns)
    return path



@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """Self-signed CAs and certificates made for this run (tests/board/tls_certs.py)."""
    from tls_certs import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))
