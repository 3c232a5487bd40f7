"""Harness for the board integration tests: a real hrt_boardd process, the real CLI.

``Daemon`` starts ``python -m bpuemu.board.daemon`` on a free loopback port
(``--listen 127.0.0.1:0 --port-file F``), waits for the port file and then for
grpc.health.v1 to report SERVING, and stops it with SIGTERM (the graceful
shutdown path), returning its exit code. ``run_cli`` runs
``python -m bpuemu.board.cli.hrt_model_exec`` in a subprocess from a scratch
directory, so nothing is written into the working directory and everything the
user would see (including anything gRPC prints) is captured.
"""
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bpuemu.board.backends import LocalBackend
from bpuemu.board.client import BoardClient

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
CLI_TIMEOUT_S = 120.0

#: What a model store may hold: published models and their metadata, nothing else.
STORE_FILE_RE = re.compile(r"^[0-9a-f]{64}\.(bin|json)$")


def clean_env(**extra: str) -> dict:
    """The environment for a subprocess: no inherited token, TLS setting or debug switch."""
    env = {k: v for k, v in os.environ.items() if k not in ("BPUEMU_TOKEN", "BPUEMU_DEBUG") and not k.startswith("BPUEMU_TLS_")}
    env.update(extra)
    return env


class Daemon:
    """One hrt_boardd process on a free loopback port.

    ``tls``: the client side (a TlsConfig) the harness uses for health checks and
    ``client()`` when the daemon serves TLS. ``port``: listen on that port (a
    restart on the port a previous daemon used); 0 picks a free one.
    ``preexec_fn``: run in the child before exec (resource limits, signals).
    """

    def __init__(self, workdir, *extra_args: str, env: Optional[dict] = None, tls=None, port: int = 0,
                 preexec_fn=None):
        self.workdir = os.fspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.model_dir = os.path.join(self.workdir, "models")
        self.port_file = os.path.join(self.workdir, "port")
        self.log_path = os.path.join(self.workdir, "hrt_boardd.log")
        self.tls = tls
        self.args = [sys.executable, "-m", "bpuemu.board.daemon", "--listen", f"127.0.0.1:{port}",
                     "--model-dir", self.model_dir, "--port-file", self.port_file, *extra_args]
        self.env = env if env is not None else clean_env()
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.preexec_fn = preexec_fn  # e.g. resource limits for the fault tests

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Daemon":
        self.port = 0
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, env=self.env,
                                         preexec_fn=self.preexec_fn)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.port:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hrt_boardd exited with {self.proc.returncode} before serving:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"hrt_boardd wrote no port file within {START_TIMEOUT_S}s:\n{self.log()}")
            try:
                with open(self.port_file) as f:
                    text = f.read()
                if text.endswith("\n"):
                    self.port = int(text)
            except FileNotFoundError:
                pass
            if not self.port:
                time.sleep(0.02)
        status = self.health(wait_s=max(1.0, deadline - time.monotonic()))
        if status != "SERVING":
            self.kill()
            raise RuntimeError(f"hrt_boardd health is {status}, not SERVING:\n{self.log()}")
        return self

    def health(self, service: str = "", wait_s: float = 5.0) -> str:
        """The grpc.health.v1 status name of ``service`` ("" is the whole server)."""
        with self.channel() as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=wait_s, wait_for_ready=True)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then wait; returns the exit code (killed daemons return -9)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def store_files(self) -> List[str]:
        return sorted(os.listdir(self.model_dir))

    def client(self, token: Optional[str] = None, tls=None, **kwargs) -> BoardClient:
        return BoardClient(self.target, token=token, client_name="bpuemu-tests", tls=tls or self.tls, **kwargs)

    def channel(self, **options) -> grpc.Channel:
        if self.tls is not None:
            return grpc.secure_channel(self.target, self.tls.grpc_credentials(), options=list(options.items()))
        return grpc.insecure_channel(self.target, options=list(options.items()))


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(args: Sequence[str], cwd, env: Optional[dict] = None, module: str = "bpuemu.board.cli.hrt_model_exec",
            timeout: float = CLI_TIMEOUT_S) -> CliResult:
    """Run a bpuemu command in a subprocess, from ``cwd`` (a scratch directory)."""
    proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=os.fspath(cwd),
                          env=env if env is not None else clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def hrt_model_exec_command() -> list:
    """The installed hrt_model_exec console script (beside this Python), else its module."""
    script = os.path.join(os.path.dirname(sys.executable), "hrt_model_exec")
    return [script] if os.access(script, os.X_OK) else [sys.executable, "-m", "bpuemu.board.cli.hrt_model_exec"]


def start_cli(args: Sequence[str], cwd, env: Optional[dict] = None) -> subprocess.Popen:
    """hrt_model_exec started in the background (a fault test injects its fault while it runs)."""
    return subprocess.Popen([*hrt_model_exec_command(), *map(str, args)], cwd=cwd, env=env or clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_cli(proc: subprocess.Popen, timeout: float = 60) -> CliResult:
    """Wait for a background CLI (``start_cli``); one that outlives ``timeout`` fails the test."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the client did not end within {timeout}s after the fault:\n{out}\n{err}")
    return CliResult(proc.returncode, out, err)


def assert_ok(result: CliResult) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert "Traceback" not in result.output, result.output


def assert_one_error(result: CliResult, *words: str, exit_code: Optional[int] = None, ignore: str = "") -> str:
    """Non-zero exit, one ``ERROR ...`` line naming ``words`` (maybe a Hint: line), no traceback.

    ``ignore``: a regex of stderr lines that are not the tool's own (e.g. gRPC's C-core log).
    Returns the ERROR line.
    """
    out = result.output
    assert result.returncode != 0, f"expected a failure, got exit 0\n{out}"
    if exit_code is not None:
        assert result.returncode == exit_code, out
    assert "Traceback" not in out, out
    lines = [line for line in result.stderr.splitlines() if line.strip() and not (ignore and re.match(ignore, line))]
    assert lines and lines[0].startswith("ERROR "), f"stderr must start with one ERROR line:\n{result.stderr}"
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("Hint: ")), \
        f"expected one ERROR line and at most one Hint: line:\n{result.stderr}"
    assert sum(line.startswith("ERROR") for line in out.splitlines()) == 1, out
    for word in words:
        assert word.lower() in lines[0].lower(), f"'{word}' not in the error line: {lines[0]}"
    return lines[0]


def assert_store_clean(daemon: Daemon) -> None:
    """The store holds only published models (<sha>.bin + <sha>.json), never partial uploads."""
    files = daemon.store_files()
    stray = [f for f in files if not STORE_FILE_RE.match(f)]
    assert not stray, f"unexpected files in the model store: {stray}"
    shas = {f[:64] for f in files}
    for sha in shas:
        assert f"{sha}.bin" in files and f"{sha}.json" in files, f"model {sha[:12]} is half-published: {files}"


def assert_daemon_serves(daemon: Daemon, model_path: str, x: np.ndarray, token: Optional[str] = None) -> None:
    """A good infer still succeeds, bit for bit equal to the local runtime, and the store is clean."""
    assert daemon.proc.poll() is None, f"hrt_boardd died:\n{daemon.log()}"
    with daemon.client(token) as board:
        sha = board.ensure_model(model_path)
        remote = board.infer(sha, "", [x]).outputs
    with LocalBackend([model_path]) as local:
        expected = local.model().infer([x]).outputs
    assert list(remote) == list(expected)
    for name in expected:
        assert np.array_equal(remote[name], expected[name]), name
    assert_store_clean(daemon)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def damaged_copies(src: str, directory) -> dict:
    """Broken variants of a good `.bin`: kind -> path (in ``directory``)."""
    import struct

    with open(src, "rb") as f:
        good = f.read()
    corrupt = bytearray(good)
    corrupt[len(corrupt) // 2] ^= 0xFF  # inside the blob area: a checksum must catch it
    newer = bytearray(good)
    struct.pack_into("<H", newer, 8, 99)  # format major 99
    variants = {
        "corrupt": bytes(corrupt),
        "truncated": good[: len(good) // 2],
        "wrong_magic": b"NOTABPU!" + good[8:],
        "newer_major": bytes(newer),
    }
    paths = {}
    for kind, data in variants.items():
        path = os.path.join(os.fspath(directory), f"{kind}.bin")
        with open(path, "wb") as f:
            f.write(data)
        paths[kind] = path
    return paths
