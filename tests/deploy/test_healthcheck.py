"""The probe the image, compose and install.sh use: python -m bpuemu.board.daemon.healthcheck.

Against real daemons on loopback: plain, TLS and mTLS (certificates made in
the test), each with the probe's exit status and its one-line message.
"""
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

from deploy_helpers import REPO, free_port

BOARD_TESTS = str(REPO / "tests" / "board")
if BOARD_TESTS not in sys.path:
    sys.path.append(BOARD_TESTS)


def probe(target, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BPUEMU_")}
    return subprocess.run([sys.executable, "-m", "bpuemu.board.daemon.healthcheck", "--target", target, "--timeout", "3",
                           *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def start(tmp_path):
    procs = []

    def start_daemon(*args, probe_args=()):
        token = tmp_path / "token"
        if not token.exists():
            token.write_text(secrets.token_hex(32))
        port = free_port()
        target = f"127.0.0.1:{port}"
        log = open(tmp_path / f"log{port}", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "bpuemu.board.daemon", "--listen", target, "--model-dir",
                                 str(tmp_path / "models"), "--token-file", str(token), *args],
                                stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        deadline = time.monotonic() + 60
        while probe(target, "-q", *probe_args).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / f"log{port}").read_text()
            time.sleep(0.2)
        return target

    yield start_daemon
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_plain(start):
    target = start()
    ok = probe(target)
    assert (ok.returncode, ok.stdout.strip()) == (0, f"{target}: SERVING")
    assert probe(target, "--service", "bpuemu.board.v1.Board", "-q").returncode == 0
    unknown = probe(target, "--service", "no.such.Service")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == f"ERROR hrt_boardd at {target} reports SERVICE_UNKNOWN for service 'no.such.Service'"


def test_tls_and_mtls(start, tmp_path):
    from tls_certs import make_pki

    pki = make_pki(tmp_path / "pki")
    target = start("--tls-cert", pki.server_cert, "--tls-key", pki.server_key, probe_args=("--tls-ca", pki.ca))
    assert probe(target, "--tls-ca", pki.ca).returncode == 0
    plain = probe(target)
    assert plain.returncode == 1 and plain.stderr.startswith(f"ERROR hrt_boardd at {target} did not answer"), plain.stderr
    wrong_ca = probe(target, "--tls-ca", pki.other_ca)
    assert wrong_ca.returncode == 1 and "Traceback" not in wrong_ca.stderr, wrong_ca.stderr

    mutual = start("--tls-cert", pki.server_cert, "--tls-key", pki.server_key, "--tls-ca", pki.ca,
                   probe_args=("--tls-ca", pki.ca, "--tls-cert", pki.client_cert, "--tls-key", pki.client_key))
    assert probe(mutual, "--tls-ca", pki.ca, "--tls-cert", pki.client_cert, "--tls-key", pki.client_key).returncode == 0
    no_client_cert = probe(mutual, "--tls-ca", pki.ca)
    assert no_client_cert.returncode == 1 and no_client_cert.stderr.startswith("ERROR "), no_client_cert.stderr
