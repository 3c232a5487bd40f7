"""Harness for the SSH tests: a real OpenSSH sshd on a free loopback port.

``Sshd`` makes a throwaway host key and user key with ssh-keygen, writes a
minimal sshd_config into its work dir (loopback only, keys from that dir, no
PAM), starts ``/usr/sbin/sshd -D -e -f CONFIG`` and waits until the port
answers with an SSH banner. ``known_hosts`` is a file that trusts exactly
that host key. The board "behind" it is this machine, so the board-side
command is ``<this python> -m bpuemu.board.cli.hrt_model_exec``.

``Sshd(workdir, root_password="...")`` also lets root log in with that
password, as the seed's ``hb_verifier -b IP -u root -p PASSWORD`` does: sshd
runs in a mount namespace of its own (``unshare --mount``) where a copy of
/etc/shadow carrying that password's hash is bind-mounted over the real one,
so the machine's own accounts are never changed. Where sshd cannot run, ``Sshd``
skips the test (fails it under CI: tests/helpers/installed.py).

Also puts tests/board on sys.path so the board harness (``Daemon``,
``run_cli``, ``assert_one_error``) is shared, not copied.
"""
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

_BOARD_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "board")
if os.path.abspath(_BOARD_TESTS) not in [os.path.abspath(p) for p in sys.path]:
    sys.path.insert(0, os.path.abspath(_BOARD_TESTS))

from helpers.installed import require  # noqa: E402
from boardd_harness import CliResult, Daemon, assert_ok, assert_one_error, clean_env, run_cli  # noqa: E402,F401

SSHD = "/usr/sbin/sshd"
START_TIMEOUT_S = 15.0
#: The board-side hrt_model_exec, as the sshd session runs it.
REMOTE_COMMAND = f"{sys.executable} -m bpuemu.board.cli.hrt_model_exec"


def sshd_unavailable() -> Optional[str]:
    """Why a real sshd cannot run here (None when it can)."""
    if not os.path.exists(SSHD):
        return f"{SSHD} is missing (scripts/test.sh installs openssh-server as root)"
    if not shutil.which("ssh-keygen"):
        return "ssh-keygen is missing"
    if os.geteuid() != 0:
        return "sshd tests log in as root and need to run as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: str) -> str:
    """A new ed25519 key pair at ``path`` (no passphrase); returns the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bpuemu-tests", "-f", path],
                   check=True, capture_output=True, timeout=30)
    with open(path + ".pub") as f:
        return f.read().strip()


class Sshd:
    """One sshd on a free loopback port, with its own host key and one authorized user key."""

    def __init__(self, workdir, root_password: Optional[str] = None, board_env: Optional[Dict[str, str]] = None):
        require(sshd_unavailable())  # a skip here, a failure under CI
        self.workdir = os.fspath(workdir)
        self.root_password = root_password
        # The board's own environment (sshd's SetEnv), e.g. BPUEMU_BOARD_MARCH: what the board says it is.
        self.board_env = dict(board_env or {})
        os.makedirs(self.workdir, exist_ok=True)
        self.host_key = os.path.join(self.workdir, "ssh_host_ed25519_key")
        self.user_key = os.path.join(self.workdir, "id_ed25519")
        self.other_key = os.path.join(self.workdir, "id_other")  # a key the board does not authorize
        self.authorized_keys = os.path.join(self.workdir, "authorized_keys")
        self.known_hosts = os.path.join(self.workdir, "known_hosts")
        self.config = os.path.join(self.workdir, "sshd_config")
        self.log_path = os.path.join(self.workdir, "sshd.log")
        # The board's tmp dir (--remote-tmp): this harness's own, so test runs sharing the
        # machine never see, or sweep, each other's work dirs in /tmp.
        self.remote_tmp = os.path.join(self.workdir, "board_tmp")
        os.makedirs(self.remote_tmp, exist_ok=True)
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        host_pub = keygen(self.host_key)
        user_pub = keygen(self.user_key)
        keygen(self.other_key)
        with open(self.authorized_keys, "w") as f:
            f.write(user_pub + "\n")
        self.host_pub = host_pub

    @property
    def user(self) -> str:
        return "root"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"{self.user}@{self.address}"

    def _write_config(self) -> None:
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            f"PidFile {os.path.join(self.workdir, 'sshd.pid')}",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin yes",
            "PubkeyAuthentication yes",
            "PasswordAuthentication yes",
            "KbdInteractiveAuthentication no",
            "UseDNS no",
            "PrintMotd no",
            "LoginGraceTime 20",
            "MaxStartups 50",
            "Subsystem sftp internal-sftp",
            "LogLevel INFO",
        ]
        if self.board_env:
            lines.append("SetEnv " + " ".join(f"{k}={v}" for k, v in self.board_env.items()))
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")

    def start(self) -> "Sshd":
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        for _attempt in range(5):
            self.port = _free_port()
            self._write_config()
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(self._command(), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
            if self._wait_ready():
                with open(self.known_hosts, "w") as f:
                    f.write(self.known_hosts_line() + "\n")
                return self
            self.stop()
        raise RuntimeError(f"sshd did not start:\n{self.log()}")

    def _command(self) -> List[str]:
        sshd = [SSHD, "-D", "-e", "-f", self.config]
        if self.root_password is None:
            return sshd
        # unshare and sh exec into sshd: the process started here is sshd itself.
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$0" /etc/shadow && exec "$@"', self._shadow_with_root_password(), *sshd]

    def _shadow_with_root_password(self) -> str:
        """A copy of /etc/shadow whose root entry has ``root_password`` (for this sshd's namespace only)."""
        digest = subprocess.run(["openssl", "passwd", "-6", "-stdin"], input=self.root_password, capture_output=True,
                                text=True, check=True, timeout=30).stdout.strip()
        with open("/etc/shadow") as f:
            lines = f.read().splitlines()
        lines = [":".join(["root", digest] + line.split(":")[2:]) if line.startswith("root:") else line
                 for line in lines]
        path = os.path.join(self.workdir, "shadow")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def known_hosts_line(self, public_key: Optional[str] = None) -> str:
        key_type, key_b64 = (public_key or self.host_pub).split()[:2]
        return f"[127.0.0.1]:{self.port} {key_type} {key_b64}"

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False  # e.g. the port was taken between choosing and binding it
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                    s.settimeout(2.0)
                    if s.recv(64).startswith(b"SSH-"):
                        return True
            except OSError:
                time.sleep(0.02)
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def cli_args(self, *extra: str, identity: Optional[str] = None, known_hosts: Optional[str] = None) -> List[str]:
        """hrt_model_exec --ssh arguments that reach this sshd as root with the user key."""
        return ["--ssh", self.target, "--identity", identity or self.user_key, "--known-hosts",
                known_hosts or self.known_hosts, "--remote-command", REMOTE_COMMAND, "--remote-tmp", self.remote_tmp,
                *extra]

    def work_dirs(self) -> set:
        """The SSH transport's work dirs currently on the (loopback) board, as paths."""
        return {os.path.join(self.remote_tmp, d) for d in os.listdir(self.remote_tmp) if d.startswith("bpuemu-ssh-")}
