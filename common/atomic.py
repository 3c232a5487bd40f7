"""Atomic publishing of the files a user keeps: all of a run's outputs, or none.

Every tool that writes a file a user keeps (makertbin's five artifacts and its
debug dumps, hb_model_modifier, hb_pack, hb_perf's result folder, profiler
logs, dumps, reports) writes through here, so a failed or killed run never
leaves a partial file or destroys the previous run's good one.

One file::

    write_file_atomic("out.bin", data)          # temp file beside it, fsync, rename
    with atomic_output("report.json", "w") as f:
        json.dump(report, f)                    # renamed into place on success only

Several outputs of one run (all published together, or none)::

    with Staging(working_dir, "makertbin") as stage:
        onnx.save(model, stage.path("m_original_float_model.onnx"))
        ...
        stage.publish()                         # rename each entry into working_dir

The staging directory is ``<target>/.<label>-XXXX.partial``: inside the
target, so publishing is a rename on one filesystem. Its ``.lock`` is held
(``flock``) while the run lives, so a later run tells an abandoned staging
directory (the run was SIGKILLed) from a live one. Before renaming,
``publish`` writes a ``PUBLISH`` journal: a run killed inside the (short)
rename loop is rolled forward by the next ``recover_stale`` of that target,
a run killed before it is rolled back (its staging directory removed). On an
exception (error, Ctrl-C, or SIGTERM, which a Staging in the main thread turns
into an exit with status 143), the staging directory is removed and the log
says so; the target's previous files are untouched either way.

``checkpoint(name)`` is a test hook: when ``BPUEMU_TEST_STOP_AT`` names it,
the process stops itself (SIGSTOP) there, so a test can SIGKILL it at an
exact point of a run. Every Staging has two: ``<label>:publish`` (all
written, nothing renamed) and ``<label>:publishing`` (after the first rename).
"""
import contextlib
import functools
import fcntl
import logging
import os
import shutil
import signal
import tempfile
import threading
from typing import IO, Iterator, List, Optional, Union

_SUFFIX = ".partial"
_LOCK = ".lock"
_JOURNAL = "PUBLISH"
_REPLACED = ".replaced-"

log = logging.getLogger("bpuemu.common.atomic")


def checkpoint(name: str) -> None:
    """Test hook: stop this process here when BPUEMU_TEST_STOP_AT names this point."""
    if os.environ.get("BPUEMU_TEST_STOP_AT") == name:
        os.kill(os.getpid(), signal.SIGSTOP)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=1)
def _umask() -> int:
    """The process's umask, read once (without setting it, which would race other threads)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        return 0o022


def _new_file_mode(path: str) -> int:
    """The mode a plain open() would give ``path``: the old file's, or 0o666 minus the umask."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_output(path: Union[str, os.PathLike], mode: str = "wb") -> Iterator[IO]:
    """A file object for ``path``: written to a temp file beside it, renamed into place on success."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)[:40]}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, _new_file_mode(path))  # mkstemp makes 0600
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_file_atomic(path: Union[str, os.PathLike], data: Union[bytes, str]) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    with atomic_output(path, "wb" if isinstance(data, (bytes, bytearray, memoryview)) else "w") as f:
        f.write(data)


def _move_into_place(src: str, dst: str, trash_dir: str) -> None:
    """Rename ``src`` to ``dst``; an existing directory ``dst`` is first moved into ``trash_dir``."""
    if os.path.isdir(dst) and not os.path.islink(dst):
        old = os.path.join(trash_dir, _REPLACED + os.path.basename(dst))
        if os.path.lexists(old):
            shutil.rmtree(old, ignore_errors=True)
        os.rename(dst, old)
    os.replace(src, dst)


class Staging:
    """A fresh directory inside ``target`` that holds one run's outputs until ``publish``."""

    def __init__(self, target: Union[str, os.PathLike], label: str, logger: Optional[logging.Logger] = None):
        self.target = os.path.abspath(os.fspath(target))
        self.label = label
        self.log = logger or log
        self.dir = ""
        self.published: List[str] = []
        self._lock_fd = -1
        self._old_sigterm = None

    def __enter__(self) -> "Staging":
        os.makedirs(self.target, exist_ok=True)
        recover_stale(self.target, self.log)
        self.dir = tempfile.mkdtemp(prefix=f".{self.label}-", suffix=_SUFFIX, dir=self.target)
        self._lock_fd = os.open(os.path.join(self.dir, _LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self._old_sigterm = _exit_on_sigterm()
        return self

    def path(self, name: str) -> str:
        """Where the output that will be published as ``<target>/<name>`` is written now."""
        if os.sep in name or name in ("", ".", "..", _LOCK, _JOURNAL) or name.startswith(_REPLACED):
            raise ValueError(f"not a plain output name: {name!r}")
        return os.path.join(self.dir, name)

    def final(self, name: str) -> str:
        return os.path.join(self.target, name)

    def publish(self) -> List[str]:
        """Move every output into the target (one rename each); returns their final paths."""
        checkpoint(f"{self.label}:publish")
        names = sorted(n for n in os.listdir(self.dir) if n not in (_LOCK, _JOURNAL))
        write_file_atomic(os.path.join(self.dir, _JOURNAL), "\n".join(names) + "\n")
        _fsync_dir(self.dir)
        for i, name in enumerate(names):
            _move_into_place(os.path.join(self.dir, name), self.final(name), self.dir)
            if i == 0:
                checkpoint(f"{self.label}:publishing")
        _fsync_dir(self.target)
        self.published = [self.final(n) for n in names]
        return self.published

    def _close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        shutil.rmtree(self.dir, ignore_errors=True)

    def __exit__(self, exc_type, exc, tb) -> bool:
        _restore_sigterm(self._old_sigterm)
        published = bool(self.published)
        self._close()
        if exc_type is not None and not published:
            what = "interrupted" if issubclass(exc_type, (KeyboardInterrupt, SystemExit)) else "failed"
            self.log.warning("%s %s: its partial outputs in %s were removed; the previous outputs in %s are "
                             "unchanged", self.label, what, self.dir, self.target)
        return False


def _exit_on_sigterm():
    """While a Staging is open in the main thread, SIGTERM (kill, timeout, systemd) exits like Ctrl-C does:
    through the ``with`` block's cleanup, exit status 143. Returns the handler to restore (None: unchanged)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    return signal.SIG_DFL


def _restore_sigterm(old) -> None:
    if old is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, old)


def _is_abandoned(stage_dir: str) -> bool:
    """True when no live process holds the staging directory's lock."""
    try:
        fd = os.open(os.path.join(stage_dir, _LOCK), os.O_RDWR)
    except FileNotFoundError:
        return True  # killed between mkdtemp and taking the lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def recover_stale(target: Union[str, os.PathLike], logger: Optional[logging.Logger] = None) -> List[str]:
    """Finish or remove what killed runs left in ``target``; returns the staging directories handled."""
    logger = logger or log
    target = os.fspath(target)
    handled = []
    try:
        entries = os.listdir(target)
    except FileNotFoundError:
        return handled
    for entry in sorted(entries):
        stage = os.path.join(target, entry)
        if not (entry.startswith(".") and entry.endswith(_SUFFIX) and os.path.isdir(stage)):
            continue
        if not _is_abandoned(stage):
            continue
        journal = os.path.join(stage, _JOURNAL)
        if os.path.isfile(journal):
            with open(journal) as f:
                names = [n for n in f.read().splitlines() if n]
            for name in names:
                src = os.path.join(stage, name)
                if os.path.lexists(src):
                    _move_into_place(src, os.path.join(target, name), stage)
            logger.warning("a run killed while publishing its outputs was completed: %s now hold that run's "
                           "outputs", ", ".join(names))
        else:
            logger.warning("removed %s, the partial outputs of a run that was killed; the outputs in %s are "
                           "those of the last run that finished", stage, target)
        shutil.rmtree(stage, ignore_errors=True)
        handled.append(stage)
    return handled


@contextlib.contextmanager
def staged_dir(target_dir: Union[str, os.PathLike], label: str) -> Iterator[str]:
    """A fresh directory to fill; on success it replaces ``target_dir`` as a whole (old contents dropped)."""
    target_dir = os.path.abspath(os.fspath(target_dir))
    name = os.path.basename(target_dir)
    with Staging(os.path.dirname(target_dir), label) as stage:
        work = stage.path(name)
        os.makedirs(work)
        yield work
        stage.publish()
