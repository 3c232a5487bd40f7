"""The SSH transport: run the board's own hrt_model_exec over SSH (paramiko).

    opts = SshOptions("root@board:22", identity="~/.ssh/id_ed25519")
    with SshBackend(opts, ["m.bin"]) as be:
        result = be.model().infer([x])

``SshBackend`` implements the Backend/ModelHandle interface of
bpuemu.board.backends, so ``hrt_model_exec --ssh`` and ``hb_verifier -b HOST``
use it exactly like the local runtime or a gRPC board. It is registered as the
``ssh`` entry point of the ``bpuemu.transports`` group; the board looks it up
there and never imports this module (or paramiko).

What happens on the board, in order:

1. connect; the board's host key must be in known_hosts (an unknown key is
   recorded there only with ``accept_new_host_key``; a changed key is always
   refused); authenticate with a password or a key (with neither: the SSH
   agent and ~/.ssh keys, as ssh does);
2. SFTP: make a fresh work dir ``<remote_tmp>/bpuemu-ssh-<random>`` (mode
   0700) and upload each model file into it, once per session;
3. per call: upload the inputs as .npy files into ``call-<n>/``, run
   ``<remote command> infer --model_file ... --input_file ... --enable_dump true
   --dump_format bin [--dump_intermediate 1] --dump_path call-<n>/out --json``
   in the work dir, read the board's ``--json`` document
   (bpuemu.common.exec_json: each tensor's dump file, dtype and shape, each
   frame's latency), fetch the dumps it names, and remove ``call-<n>/``;
   ``perf --json`` gives the report and names the profiler files; the board's
   arch, onnxruntime version and load time come from ``model_info --json``.
   The transport parses no console text;
4. close: remove the work dir (by SFTP).

Every step has a deadline (connect and authentication, each SFTP operation,
each command) and every failure becomes one BpuEmuError that names the board:
unreachable, authentication refused, host key unknown or changed, no
hrt_model_exec there, connection lost mid-run, the remote tool's own error.
"""
import base64
import contextlib
import hashlib
import io
import logging
import os
import posixpath
import secrets
import select
import shlex
import socket
import stat
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from bpuemu.common.container import read_bin
from bpuemu.common.errors import (
    BoardUnavailable,
    BpuEmuError,
    DeadlineExceeded,
    IncompatibleVersion,
    InvalidInput,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from bpuemu.common.proto import model_pb2
from bpuemu.common.exec_json import dump_file, entry_dtype_shape, read_document
from bpuemu.common.wire import join_target, split_target
from bpuemu.board.backends import Backend, ModelHandle, Platform, TransportRequest
from bpuemu.board.client import InferResult
from bpuemu.board.runtime.dump import safe
from bpuemu.board.runtime.perf_job import PerfConfig, PerfReport
from bpuemu.host.clients.ssh_options import SshOptions

log = logging.getLogger(__name__)
#: Where paramiko's own transport log goes (instead of "paramiko.transport"); silent unless configured.
PARAMIKO_LOG = __name__ + ".paramiko"

DEFAULT_SSH_PORT = 22
DEFAULT_USER = "root"
#: Seconds each frame may add to a command's deadline (per thread), beyond SshOptions.command_timeout_s.
FRAME_BUDGET_S = 1.0


@dataclass(frozen=True)
class SshTarget:
    user: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return join_target(self.host, self.port)

    def __str__(self) -> str:
        return f"{self.user}@{self.address}"


def parse_target(target: str, user: Optional[str] = None) -> SshTarget:
    """``[user@]host[:port]`` -> SshTarget (user root, port 22 by default)."""
    user_part, _, hostport = (target or "").strip().rpartition("@")
    try:
        host, port = split_target(hostport, DEFAULT_SSH_PORT)
    except ValueError as exc:
        raise InvalidInput(f"bad SSH board address '{target}': {exc}", hint="use [USER@]HOST[:PORT], e.g. root@192.168.1.10") from None
    return SshTarget(user or user_part or DEFAULT_USER, host, port)


def fingerprint(key: paramiko.PKey) -> str:
    """The key's SHA256 fingerprint as ssh-keygen -l prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return f"{key.get_name()} SHA256:{base64.b64encode(digest).decode().rstrip('=')}"


class UnknownHostKey(PermissionDenied):
    pass


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(
            f"the host key of board {hostname} ({fingerprint(key)}) is not in {self.known_hosts}; refusing to connect",
            hint="check the fingerprint on the board (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
                 "then pass --accept-new-host-key to trust and record it",
        )


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """Like ssh's StrictHostKeyChecking=accept-new: record an unknown key (a changed one is still refused)."""

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        directory = os.path.dirname(os.path.abspath(self.known_hosts))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(self.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        log.warning("Permanently added '%s' (%s) to the list of known hosts in %s.", hostname, fingerprint(key), self.known_hosts)


@dataclass
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str


#: Run on the board by make_work_dir: sweep dead sessions' work dirs, then make this one's.
#: ``/proc/PID/stat`` field 22 (start time) tells a live owner from a reused PID.
_WORK_DIR_SCRIPT = r"""
starttime() {{ sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }}
if [ -r /proc/$$/stat ]; then
  for d in {tmp}/bpuemu-ssh-*; do
    [ -f "$d/.owner" ] || continue
    read -r pid start < "$d/.owner" || continue
    [ -z "$start" ] || [ "$(starttime "$pid")" = "$start" ] && continue
    rm -rf -- "$d" 2>/dev/null && echo "$d"
  done
fi
mkdir -m 700 -- {new} && echo "$PPID $(starttime $PPID)" > {new}/.owner
"""


class SshSession:
    """One SSH connection to a board: commands with deadlines, SFTP, a work dir."""

    def __init__(self, options: SshOptions):
        self.options = options
        self.target = parse_target(options.target, options.user)
        self.known_hosts = os.path.expanduser(options.known_hosts or "~/.ssh/known_hosts")
        self.client = paramiko.SSHClient()
        self.client.set_log_channel(PARAMIKO_LOG)
        quiet = logging.getLogger(PARAMIKO_LOG)
        if quiet.level == logging.NOTSET:
            # paramiko logs each failure ("Socket exception: ...") that guard() already
            # turns into the one error line; configure this logger to see them.
            quiet.setLevel(logging.CRITICAL)
        self.transport: Optional[paramiko.Transport] = None
        self.sftp: Optional[paramiko.SFTPClient] = None
        self.work_dir = ""
        self.stalled = False  # an SFTP operation timed out: the connection is not to be waited on again
        try:
            self._connect()
            with self.guard("opening SFTP"):
                self.sftp = paramiko.SFTPClient.from_transport(self.transport)
                self.sftp.get_channel().settimeout(options.connect_timeout_s)
        except BaseException:
            self.client.close()
            raise

    # -- connection --------------------------------------------------------
    def _connect(self) -> None:
        o, t = self.options, self.target
        if os.path.exists(self.known_hosts):
            try:
                self.client.load_system_host_keys(self.known_hosts)
            except (OSError, paramiko.SSHException) as exc:
                raise InvalidInput(f"cannot read known_hosts file {self.known_hosts}: {exc}") from None
        policy = _AcceptNew if o.accept_new_host_key else _RefuseUnknown
        self.client.set_missing_host_key_policy(policy(self.known_hosts))
        identity = os.path.expanduser(o.identity) if o.identity else None
        if identity and not os.path.isfile(identity):
            raise NotFound(f"identity file not found: {identity}")
        explicit = bool(o.password or identity)
        timeout = o.connect_timeout_s
        try:
            self.client.connect(
                t.host, t.port, username=t.user, password=o.password or None, key_filename=identity,
                look_for_keys=not explicit, allow_agent=not explicit, timeout=timeout, banner_timeout=timeout,
                auth_timeout=timeout, channel_timeout=timeout,
            )
        except BpuEmuError:
            raise
        except paramiko.BadHostKeyException as exc:
            raise PermissionDenied(
                f"HOST KEY MISMATCH for board {t.address}: {self.known_hosts} has {fingerprint(exc.expected_key)}, "
                f"the board presents {fingerprint(exc.key)}; refusing to connect (someone may be intercepting)",
                hint=f"if the board was reinstalled, remove its old key: ssh-keygen -R '{exc.hostname}' -f {self.known_hosts}",
            ) from None
        except paramiko.PasswordRequiredException:
            raise Unauthenticated(f"identity file {identity} is encrypted; bpuemu cannot ask for its passphrase",
                                  hint="load it into ssh-agent instead, or use an unencrypted key",
                                  subject="ssh_identity") from None
        except paramiko.AuthenticationException as exc:
            how = "password" if o.password else ("key " + identity if identity else "the SSH agent and ~/.ssh keys")
            raise Unauthenticated(f"board {t} refused SSH authentication with {how} ({exc})",
                                  hint="check the user, the password or the key", subject="ssh_login") from None
        except socket.timeout:
            raise BoardUnavailable(f"board {t.address} did not answer SSH within {timeout:.0f} s",
                                   hint="check the address and that the board is up") from None
        except NoValidConnectionsError as exc:
            reason = "; ".join(sorted({e.strerror or str(e) for e in exc.errors.values()})) or "connection refused"
            raise BoardUnavailable(f"board {t.address} is unreachable over SSH: {reason}",
                                   hint="check the address and port, and that sshd runs on the board") from None
        except socket.gaierror as exc:
            raise BoardUnavailable(f"board host '{t.host}' cannot be resolved: {exc.strerror}") from None
        except paramiko.SSHException as exc:
            raise BoardUnavailable(f"board {t.address} did not complete the SSH handshake: {exc}",
                                   hint="is this an SSH port?") from None
        except (OSError, EOFError) as exc:
            raise BoardUnavailable(f"board {t.address} is unreachable over SSH: {getattr(exc, 'strerror', None) or exc}") from None
        self.transport = self.client.get_transport()
        self.transport.set_keepalive(5)

    @contextlib.contextmanager
    def guard(self, what: str):
        """Translate transport failures during ``what`` into one BpuEmuError."""
        try:
            yield
        except BpuEmuError:
            raise
        except socket.timeout:
            self.stalled = True  # close() then leaves the work dir to the next session's sweep
            raise DeadlineExceeded(f"board {self.target} did not answer {what} within {self.options.connect_timeout_s:.0f} s",
                                   hint="the board or its network may be overloaded") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if self.transport is None or not self.transport.is_active():
                raise BoardUnavailable(f"the connection to board {self.target} was lost during {what}",
                                       hint="the board may have rebooted or lost its network") from None
            raise BoardUnavailable(f"board {self.target}: {what} failed: {getattr(exc, 'strerror', None) or exc}") from None

    # -- commands ----------------------------------------------------------
    def exec(self, command: str, what: str, timeout: Optional[float] = None) -> CommandResult:
        """Run a shell command on the board; waits at most ``timeout`` seconds."""
        timeout = timeout or self.options.command_timeout_s
        deadline = time.monotonic() + timeout
        with self.guard(what):
            chan = self.transport.open_session(timeout=self.options.connect_timeout_s)
        out: List[bytes] = []
        err: List[bytes] = []
        try:
            with self.guard(what):
                chan.exec_command(command)
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DeadlineExceeded(f"{what} on board {self.target} did not finish within {timeout:.0f} s",
                                               hint="the board may be overloaded or the job too long")
                    select.select([chan], [], [], min(remaining, 1.0))
                    while chan.recv_ready():
                        out.append(chan.recv(1 << 16))
                    while chan.recv_stderr_ready():
                        err.append(chan.recv_stderr(1 << 16))
                    if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                        break
                    if not self.transport.is_active():
                        break
        finally:
            chan.close()
        if not self.transport.is_active():
            raise BoardUnavailable(f"the connection to board {self.target} was lost during {what}",
                                   hint="the board may have rebooted, crashed or lost its network")
        if chan.exit_status < 0:  # the channel closed without an exit status: killed by a signal
            raise BoardUnavailable(f"the board {self.target} died during {what}: the remote process was killed",
                                   hint="check the board's memory and kernel log (dmesg)")
        return CommandResult(chan.exit_status, b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace"))

    def hrt_model_exec(self, args: Sequence[str], what: str, timeout: Optional[float] = None) -> CommandResult:
        """Run the board's hrt_model_exec in the work dir; returns its result or raises its error."""
        command = f"cd {shlex.quote(self.work_dir or '/')} && {self.options.remote_command} " + " ".join(shlex.quote(a) for a in args)
        result = self.exec(command, what, timeout)
        if result.exit_status == 0:
            return result
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        last = lines[-1].strip() if lines else "no message"
        if result.exit_status in (126, 127) or "command not found" in result.stderr:
            raise NotFound(f"board {self.target} lacks hrt_model_exec: '{self.options.remote_command}' cannot be run there ({last})",
                           hint="install the board package there (deploy/), or name the command that runs it",
                           subject="remote_command")
        error = next((line for line in lines if line.startswith("ERROR ")), None)
        if error is not None:
            hint = next((line[len("Hint: "):] for line in lines if line.startswith("Hint: ")), "")
            raise InvalidInput(f"board {self.target}: {error[len('ERROR '):]}", hint=hint)
        if result.exit_status == 2:
            raise IncompatibleVersion(f"hrt_model_exec on board {self.target} rejected the command line: {last}",
                                      hint="install the same bpuemu version on host and board")
        raise InvalidInput(f"board {self.target}: {what} failed with exit status {result.exit_status}: {last}")

    # -- files ---------------------------------------------------------------
    def make_work_dir(self) -> str:
        """Make this session's work dir, after removing those of earlier sessions that ended abruptly.

        Each work dir holds ``.owner``: the PID and start time of the sshd process that
        serves its session (the shell's parent), which exists exactly as long as that
        SSH connection. A dir whose owner is gone was left by a session that was cut
        (network drop, host killed, board's sshd restarted): it is removed here, and
        the removal is logged as a warning. Dirs of live sessions, and dirs without an
        owner file, are left alone; without /proc on the board nothing is removed.
        """
        path = posixpath.join(self.options.remote_tmp, f"bpuemu-ssh-{secrets.token_hex(6)}")
        script = _WORK_DIR_SCRIPT.format(tmp=shlex.quote(self.options.remote_tmp), new=shlex.quote(path))
        result = self.exec(script, f"creating {path}", self.options.connect_timeout_s)
        if result.exit_status != 0:
            reason = (result.stderr.strip().splitlines() or ["no message"])[-1]
            raise BoardUnavailable(f"board {self.target}: cannot create the work dir {path}: {reason}",
                                   hint="check that the board's remote tmp dir exists and is writable")
        self.work_dir = path
        removed = [line for line in result.stdout.splitlines() if line.startswith(self.options.remote_tmp)]
        if removed:
            log.warning("board %s: removed %d work dir(s) left by earlier sessions that ended abruptly: %s",
                        self.target, len(removed), ", ".join(removed))
        return path

    def put(self, remote: str, data: bytes, what: str) -> None:
        with self.guard(what):
            with self.sftp.open(posixpath.join(self.work_dir, remote), "wb") as f:
                f.set_pipelined(True)
                f.write(data)

    def put_file(self, local: str, remote: str) -> None:
        with self.guard(f"upload of {os.path.basename(local)}"):
            self.sftp.put(local, posixpath.join(self.work_dir, remote), confirm=True)

    def get(self, remote: str, what: str) -> bytes:
        with self.guard(what):
            with self.sftp.open(posixpath.join(self.work_dir, remote), "rb") as f:
                f.prefetch()
                return f.read()

    def listdir(self, remote: str, what: str) -> List[str]:
        with self.guard(what):
            try:
                return self.sftp.listdir(posixpath.join(self.work_dir, remote))
            except FileNotFoundError:
                return []

    def mkdir(self, remote: str) -> None:
        with self.guard(f"creating {remote}"):
            self.sftp.mkdir(posixpath.join(self.work_dir, remote), mode=0o700)

    def rmtree(self, remote: str) -> None:
        with self.guard(f"removing {remote}"):
            self._rmtree(posixpath.join(self.work_dir, remote))

    def _rmtree(self, path: str) -> None:
        for entry in self.sftp.listdir_attr(path):
            child = posixpath.join(path, entry.filename)
            if stat.S_ISDIR(entry.st_mode):
                self._rmtree(child)
            else:
                self.sftp.remove(child)
        self.sftp.rmdir(path)

    def close(self) -> None:
        """Remove the work dir (best effort: the board may be gone; not after an SFTP timeout, which
        would only wait again: the next session removes it) and disconnect."""
        try:
            if self.work_dir and self.transport is not None and self.transport.is_active() and not self.stalled:
                with self.guard("cleanup"):  # by SFTP: no remote shell to start
                    self._rmtree(self.work_dir)
        except BpuEmuError as exc:
            log.debug("cleanup of %s failed: %s", self.work_dir, exc)
        finally:
            self.client.close()


def _array(data: bytes, dtype: np.dtype, shape: Sequence[int], what: str, target) -> np.ndarray:
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise IncompatibleVersion(f"board {target}: {what} came back with {len(data)} bytes, expected {expected} "
                                  f"({dtype.name} {list(shape)})", hint="install the same bpuemu version on host and board")
    return np.frombuffer(data, dtype=dtype).reshape(tuple(shape)).copy()


class SshModel(ModelHandle):
    def __init__(self, backend: "SshBackend", model: model_pb2.Model):
        super().__init__(model)
        self.backend = backend

    @property
    def session(self) -> SshSession:
        return self.backend.session

    def _upload_inputs(self, call: str, inputs: Sequence[np.ndarray]) -> List[str]:
        names = []
        for i, x in enumerate(inputs):
            buf = io.BytesIO()
            np.save(buf, np.asarray(x), allow_pickle=False)
            name = f"{call}/input_{i}.npy"
            self.session.put(name, buf.getvalue(), f"upload of input {i}")
            names.append(name)
        return names

    def _base_args(self, command: str, call: str, inputs) -> List[str]:
        args = [command, "--model_file", self.backend.remote_models, "--model_name", self.name]
        names = self._upload_inputs(call, inputs)
        if names:
            args += ["--input_file", ",".join(names)]
        return args

    def _document(self, result, command: str) -> dict:
        return read_document(result.stdout, command, f"hrt_model_exec on board {self.session.target}")

    def infer(self, inputs, frame_count=1, dump_intermediate=False) -> InferResult:
        call = self.backend.new_call()
        try:
            args = self._base_args("infer", call, inputs) + [
                "--frame_count", str(frame_count), "--enable_dump", "true", "--dump_format", "bin",
                "--dump_path", f"{call}/out", "--json"]
            if dump_intermediate:
                args += ["--dump_intermediate", "1"]
            timeout = self.backend.options.command_timeout_s + (frame_count - 1) * FRAME_BUDGET_S
            doc = self._document(self.session.hrt_model_exec(args, "infer", timeout), "infer")
            outputs = {e["name"]: self._fetch(call, e, f"output '{e['name']}'") for e in doc["outputs"]}
            if list(outputs) != self.output_names:
                raise IncompatibleVersion(f"board {self.session.target} returned outputs {list(outputs)}, "
                                          f"model '{self.name}' has {self.output_names}",
                                          hint="install the same bpuemu version on host and board")
            intermediates = {e["name"]: self._fetch(call, e, f"tensor '{e['name']}'")
                             for e in doc.get("intermediates", [])} if dump_intermediate else {}
        finally:
            self.backend.end_call(call)
        return InferResult(outputs, intermediates, [float(t) for t in doc["latency_ms"]])

    def _fetch(self, call: str, entry: dict, what: str) -> np.ndarray:
        """A tensor of the --json document, read back from its .bin dump."""
        name = dump_file(entry)
        if name is None:
            raise IncompatibleVersion(f"board {self.session.target} wrote no dump of {what}",
                                      hint="install the same bpuemu version on host and board")
        dtype, shape = entry_dtype_shape(entry)
        data = self.session.get(posixpath.join(call, "out", name), f"download of {what}")
        return _array(data, dtype, shape, what, self.session.target)

    def perf(self, config: PerfConfig, inputs=(), progress=None, cancel=None) -> PerfReport:
        # cancel: the remote hrt_model_exec ends with its command deadline (an SSH board is never in a farm)
        call = self.backend.new_call()
        t0 = time.monotonic()
        try:
            args = self._base_args("perf", call, inputs) + [
                "--frame_count", str(config.frame_count), "--perf_time", repr(float(config.perf_time_minutes)),
                "--thread_num", str(config.thread_num), "--core_id", str(config.core_id)]
            if config.profile:
                args += ["--profile_path", f"{call}/prof"]
            run_s = config.perf_time_minutes * 60 if config.perf_time_minutes > 0 else \
                config.frame_count * FRAME_BUDGET_S / config.thread_num
            timeout = self.backend.options.command_timeout_s + run_s
            doc = self._document(self.session.hrt_model_exec(args + ["--json"], "perf", timeout), "perf")
            report = PerfReport(**{f: doc["result"][f] for f in PerfReport.SUMMARY_FIELDS})
            texts = {name: self.session.get(posixpath.join(call, "prof", name), f"download of {name}").decode()
                     for name in doc.get("profiler_files", [])}
            report.profiler_log = texts.get("profiler.log", "")
            report.profiler_csv = texts.get("profiler.csv", "")
        finally:
            self.backend.end_call(call)
        if progress is not None:
            progress(report.frame_count, report.frame_count, time.monotonic() - t0)
        return report


class SshBackend(Backend):
    """Models on a board reached over SSH, run by the board's own hrt_model_exec."""

    @classmethod
    def open(cls, request: TransportRequest, model_files: Sequence[str]) -> "SshBackend":
        """The ``bpuemu.transports`` plugin entry: a board command's --ssh request."""
        return cls(SshOptions.from_request(request), model_files)

    def __init__(self, options: SshOptions, model_files: Sequence[str]):
        super().__init__()
        self.options = options
        binfiles = [read_bin(path) for path in model_files]  # a bad file fails before any connection
        t0 = time.perf_counter()
        self.session = SshSession(options)
        self._calls = 0
        self._facts: Optional[Tuple[Platform, float]] = None
        try:
            self.session.make_work_dir()
            remote = []
            for i, (path, binfile) in enumerate(zip(model_files, binfiles)):
                name = f"{i}_{safe(os.path.basename(path))}"
                self.session.put_file(path, name)
                remote.append(name)
                for model in binfile.manifest.models:
                    self._add(SshModel(self, model))
            self.remote_models = ",".join(remote)
        except BaseException:
            self.session.close()
            raise
        self.upload_ms = (time.perf_counter() - t0) * 1e3

    @property
    def target(self) -> SshTarget:
        return self.session.target

    @property
    def address(self) -> str:
        return str(self.target)

    @property
    def work_dir(self) -> str:
        return self.session.work_dir

    def new_call(self) -> str:
        self._calls += 1
        call = f"call-{self._calls}"
        self.session.mkdir(call)
        return call

    def end_call(self, call: str) -> None:
        if self.session.transport is not None and self.session.transport.is_active():
            try:
                self.session.rmtree(call)
            except BpuEmuError as exc:  # the work dir goes at close anyway
                log.debug("removing %s failed: %s", call, exc)

    def _board_facts(self) -> Tuple[Platform, float]:
        """(arch and onnxruntime version, model load ms) from the board's own model_info."""
        if self._facts is None:
            result = self.session.hrt_model_exec(["model_info", "--model_file", self.remote_models, "--json"], "model_info")
            doc = read_document(result.stdout, "model_info", f"hrt_model_exec on board {self.target}")
            self._facts = (Platform(doc["board"]["arch"], doc["board"]["onnxruntime_version"]), float(doc["load_ms"]))
        return self._facts

    @property
    def platform(self) -> Platform:
        return self._board_facts()[0]

    @property
    def load_ms(self) -> float:
        return self._board_facts()[1]

    @property
    def description(self) -> str:
        return f"board {self.target} over SSH ({self.platform})"

    def close(self) -> None:
        self.session.close()
