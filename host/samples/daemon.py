"""Starting the board daemon the way a user does: the ``hrt_boardd`` console script on a free loopback port.

Used by bpuemu-demo and the benchmarks.
"""
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence

from bpuemu.common.errors import BoardUnavailable


def console_script(name: str) -> str:
    """The console script ``name`` installed beside this Python (else on PATH)."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    found = here if os.access(here, os.X_OK) else shutil.which(name)
    if not found:
        raise BoardUnavailable(f"{name}: command not found; install bpuemu with pip install '.[host]'")
    return found


def start_daemon(model_dir: str, log_path: str, timeout_s: float = 30.0, echo: Optional[Callable[[str], None]] = None,
                 extra_args: Sequence[str] = ()):
    """Start hrt_boardd on a free loopback port; returns (process, "127.0.0.1:PORT").

    ``echo`` is given the command line, as a user would type it; ``extra_args``
    are more hrt_boardd flags (``--max-jobs 16``, ``--log-level WARNING``).
    """
    port_file = os.path.join(model_dir, "port")
    if os.path.exists(port_file):
        os.unlink(port_file)
    args = ["hrt_boardd", "--listen", "127.0.0.1:0", "--model-dir", model_dir, "--port-file", port_file, *extra_args]
    if echo is not None:
        echo("$ " + shlex.join(args) + " &")
    with open(log_path, "w") as log:  # the daemon keeps its own copy of the descriptor
        proc = subprocess.Popen([console_script(args[0])] + args[1:], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BoardUnavailable(f"hrt_boardd exited with code {proc.returncode}; see {log_path}")
            port = _read_port(port_file)
            if port:
                return proc, f"127.0.0.1:{port}"
            time.sleep(0.05)
        raise BoardUnavailable(f"hrt_boardd did not start within {timeout_s:.0f} s; see {log_path}")
    except BaseException:  # not started (or Ctrl-C while waiting): no daemon is left behind
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        raise


@contextlib.contextmanager
def running_daemon(model_dir: str, log_path: str, echo: Optional[Callable[[str], None]] = None,
                   extra_args: Sequence[str] = ()):
    """``start_daemon`` as a context: yields "127.0.0.1:PORT"; the daemon is stopped (SIGTERM, then SIGKILL
    after 30 s) on the way out, whatever happened inside."""
    os.makedirs(model_dir, exist_ok=True)
    proc, target = start_daemon(model_dir, log_path, echo=echo, extra_args=extra_args)
    try:
        yield target
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_port(port_file: str) -> str:
    """The port hrt_boardd wrote (atomically), or "" before it has."""
    try:
        with open(port_file) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""
