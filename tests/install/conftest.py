"""Fixtures for testing the product as a user installs it: the built wheel and fresh venvs.

The wheel is built once per session from a copy of the source (so the checkout
gets no build/ or egg-info litter, and nothing stale from an old build/ sneaks
in), with the same command a user or CI runs: ``pip wheel . --no-deps -w DIR``.
Venvs are created outside the checkout and get the wheel installed
*non-editable*; pip's own cache (~/.cache/pip) makes the second install cheap.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: What ``pip wheel .`` reads from the checkout: metadata and the source roots.
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "common", "board", "host", "aliases")
PIP_TIMEOUT_S = 600


def copy_build_inputs(dest: pathlib.Path) -> pathlib.Path:
    for name in BUILD_INPUTS:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        elif src.exists():
            shutil.copy2(src, dest / name)
    return dest


def _pip(python: str, *args: str) -> None:
    proc = subprocess.run([python, "-m", "pip", *args, "--quiet"], capture_output=True, text=True,
                          timeout=PIP_TIMEOUT_S)
    assert proc.returncode == 0, f"pip {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> pathlib.Path:
    """The bpuemu wheel, built as a user builds it."""
    src = copy_build_inputs(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("dist")
    _pip(sys.executable, "wheel", str(src), "--no-deps", "-w", str(out))
    (whl,) = out.glob("bpuemu-*.whl")
    return whl


class Venv:
    """A fresh venv with the wheel installed; runs its console scripts as a user types them."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.bin = path / "bin"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "BPUEMU_"))}
        self.env["PATH"] = f"{self.bin}{os.pathsep}/usr/local/bin:/usr/bin:/bin"
        self.env["VIRTUAL_ENV"] = str(path)

    def run(self, command: str, *args: str, cwd, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``command`` (a console script name, found on the venv's PATH) in ``cwd``."""
        exe = shutil.which(command, path=self.env["PATH"])
        assert exe, f"{command}: command not found in {self.bin}"
        # The calibration statistics cache the test runs with (tests/conftest.py), never the user's.
        env = {**self.env, "BPUEMU_CALIBRATION_CACHE": os.environ["BPUEMU_CALIBRATION_CACHE"]}
        proc = subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check:
            assert proc.returncode == 0, f"$ {command} {' '.join(args)}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc


def make_venv(path: pathlib.Path, requirement: str) -> Venv:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    _pip(str(path / "bin" / "python"), "install", requirement)
    return Venv(path)


@pytest.fixture(scope="session")
def host_venv(tmp_path_factory, wheel) -> Venv:
    """A fresh venv holding ``bpuemu[host]`` from the wheel (a development host)."""
    return make_venv(tmp_path_factory.mktemp("venv-host"), f"{wheel}[host]")


@pytest.fixture(scope="session")
def board_venv(tmp_path_factory, wheel) -> Venv:
    """A fresh venv holding the wheel alone (a board: no onnx, no paramiko, no yaml)."""
    return make_venv(tmp_path_factory.mktemp("venv-board"), str(wheel))
