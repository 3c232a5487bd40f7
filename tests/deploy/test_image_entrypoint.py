"""The board image's entry command, run as the Dockerfile writes it (no Docker engine needed).

ENTRYPOINT + CMD and the HEALTHCHECK command are parsed from
deploy/docker/Dockerfile and run here unchanged, except for what only a
container provides: the image paths (the model volume, the mounted token
secret) become temporary paths, and the port becomes a free one (in the listen
address and the health check alike, so a busy 9473 cannot fail the test).
The listen host stays 0.0.0.0 as written: the token makes that allowed.
"""
import os
import secrets
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bpuemu.board.backends import LocalBackend
from bpuemu.board.client import BoardClient
from bpuemu.common.errors import Unauthenticated
from bpuemu.common.input_types import random_rt_input

from deploy_helpers import DOCKERFILE, entry_command, flag_value, free_port, healthcheck, parse_dockerfile

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


class ImageCommand:
    """The image's commands, with container paths and the port mapped onto this machine."""

    def __init__(self, root, port: int):
        final = parse_dockerfile(DOCKERFILE)[-1]
        self.entry = entry_command(final)
        self.health = healthcheck(final).argv
        self.image_port = flag_value(self.entry, "--listen").rsplit(":", 1)[1]
        self.port = port
        self.model_dir = os.path.join(root, "models")
        self.token_file = os.path.join(root, "secrets", "bpuemu_token")
        self.paths = {flag_value(self.entry, "--model-dir"): self.model_dir,
                      flag_value(self.entry, "--token-file"): self.token_file}
        self.workdir = root
        bindir = os.path.dirname(sys.executable)
        self.executables = {"hrt_boardd": os.path.join(bindir, "hrt_boardd"), "python": sys.executable}

    def _map(self, argv):
        out = []
        for word in argv:
            word = self.paths.get(word, word)
            if word.endswith(":" + self.image_port):
                word = word[: -len(self.image_port)] + str(self.port)
            out.append(word)
        out[0] = self.executables.get(out[0], out[0])
        assert os.path.isabs(out[0]) and os.access(out[0], os.X_OK), f"{argv[0]} is not installed here: {out[0]}"
        return out

    @property
    def entry_argv(self):
        return self._map(self.entry)

    @property
    def health_argv(self):
        return self._map(self.health)


def clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("BPUEMU_TOKEN", "BPUEMU_DEBUG") and not k.startswith("BPUEMU_TLS")}


def write_token(path) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    token = secrets.token_hex(32)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(token + "\n")
    return token


def listening_sockets(port: int):
    """Local addresses in LISTEN state on ``port`` (from /proc/net/tcp)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                found.append(addr)
    return found


@pytest.fixture
def image(tmp_path):
    return ImageCommand(str(tmp_path), free_port())


def run_health(image, timeout=30):
    return subprocess.run(image.health_argv, capture_output=True, text=True, env=clean_env(), timeout=timeout)


def test_entry_command_serves_with_its_token_and_stops_on_sigterm(image, tmp_path):
    from bpuemu.host.samples import sample_bin

    token = write_token(image.token_file)
    log_path = tmp_path / "hrt_boardd.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(image.entry_argv, cwd=image.workdir, stdout=log, stderr=subprocess.STDOUT, env=clean_env())
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            health = run_health(image)
            if health.returncode == 0:
                break
            assert proc.poll() is None, f"the entry command exited with {proc.returncode}:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"not healthy after {START_TIMEOUT_S}s: {health.stderr}\n{log_path.read_text()}"
            time.sleep(0.2)
        assert health.stdout == "", "the health check runs with --quiet"

        # As written: on every interface (0.0.0.0; gRPC may bind it as the dual-stack [::]),
        # which the token makes allowed.
        bound = listening_sockets(image.port)
        assert any(set(addr) == {"0"} for addr in bound), bound

        target = f"127.0.0.1:{image.port}"
        with BoardClient(target, token="", client_name="deploy-tests") as anonymous:
            with pytest.raises(Unauthenticated):
                anonymous.handshake()
        with BoardClient(target, token=token[::-1], client_name="deploy-tests") as wrong:
            with pytest.raises(Unauthenticated):
                wrong.handshake()

        model = tmp_path / "sample.bin"
        sample_bin(str(model), height=16, width=16)
        with LocalBackend([str(model)]) as local:
            handle = local.model()
            x = [random_rt_input(s, np.random.default_rng(7)) for s in handle.model.input_specs]
            expected = handle.infer(x).outputs
        with BoardClient(target, token=token, client_name="deploy-tests") as board:
            sha = board.ensure_model(str(model))
            got = board.infer(sha, "", x).outputs
        assert list(got) == list(expected)
        for name in expected:
            assert np.array_equal(got[name], expected[name]), name
        # The upload landed in the model volume.
        assert f"{sha}.bin" in os.listdir(image.model_dir)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = "killed after timeout"
    log = log_path.read_text()
    assert code == 0, f"hrt_boardd exited with {code} on SIGTERM:\n{log}"
    assert "Traceback" not in log, log
    after = run_health(image)
    assert after.returncode == 1, after.stdout + after.stderr
    assert after.stderr.startswith("ERROR "), after.stderr


def run_entry(image, timeout=60):
    return subprocess.run(image.entry_argv, cwd=image.workdir, capture_output=True, text=True, env=clean_env(),
                          timeout=timeout)


def test_entry_command_refuses_without_the_mounted_token(image):
    """No secret mounted: the daemon exits with one clear line instead of serving."""
    proc = run_entry(image)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and image.token_file in errors[0], proc.stderr
    assert listening_sockets(image.port) == []


def test_image_listen_address_needs_the_token_flag(image):
    """The security rule the ENTRYPOINT relies on: 0.0.0.0 without --token-file is refused."""
    argv = image.entry_argv
    i = argv.index("--token-file")
    proc = subprocess.run(argv[:i] + argv[i + 2:], cwd=image.workdir, capture_output=True, text=True, env=clean_env(),
                          timeout=60)
    assert proc.returncode != 0
    assert "refusing to listen" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_healthcheck_reports_unknown_service_and_absent_board(image):
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "bpuemu.board.daemon.healthcheck", "--target", f"127.0.0.1:{port}",
                           "--timeout", "2"], capture_output=True, text=True, env=clean_env(), timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"ERROR hrt_boardd at 127.0.0.1:{port} did not answer the health check: UNAVAILABLE")
    assert "Traceback" not in proc.stderr
