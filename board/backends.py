"""One interface over where a model runs: in this process, or on a board.

``LocalBackend`` runs the runtime in-process (the x86 simulator on a host; the
real thing when hrt_model_exec runs on a board). ``RemoteBackend`` drives a
board daemon over gRPC. hrt_model_exec and hb_verifier talk only to this
interface, so the same command line works either way and outputs compare bit
for bit.

    with connect.open_backend(["m.bin"], board="127.0.0.1:9473") as be:
        h = be.model("")                # the only model, or by name
        result = h.infer([x])

A third transport, SSH (run the board's own hrt_model_exec over SSH), lives on
the host side because it needs paramiko; it plugs in through the
``bpuemu.transports`` entry point group (``ssh = "bpuemu.host.clients.ssh:
SshBackend"``), so a board install neither imports nor needs it.

One board or many, the same calls: ``model_info``, ``infer`` and ``perf`` on a
backend run on each of its boards (one for these backends, every board of a
farm for ``bpuemu.board.farm.FarmClient``) and return a ``BoardRun``: each
board's outcome (its result, or the error that board hit) plus what the boards
give together (infer: whether their outputs agree bit for bit; perf: the
aggregate). ``infer`` writes the dumps and ``perf`` the profiler files asked
for, one directory per board when there are several.

    with connect.open_backend(["m.bin"], board="a:9473,b:9473") as be:
        run = be.perf("", PerfConfig(frame_count=200), profile_path="prof")
        run.summary.fps                 # summed over the boards
        run.raise_if_failed()           # one error naming every board that failed
"""
import os
import platform
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, Generic, List, Mapping, Optional, Sequence, TypeVar, Union

import numpy as np

from bpuemu.common.atomic import write_file_atomic
from bpuemu.common.container import select_model
from bpuemu.common.errors import BpuEmuError, InvalidInput
from bpuemu.common.proto import model_pb2
from bpuemu.board.client import BoardClient, Deadlines
from bpuemu.board.runtime import InferResult, LoadedModel, Runtime, run_frames
from bpuemu.board.runtime.dump import DumpConfig
from bpuemu.board.runtime.model import ModelDescription
from bpuemu.board.runtime.perf_job import PerfConfig, PerfReport, run_perf

T = TypeVar("T")


class ModelHandle(ModelDescription):
    """A model ready to infer and perf, wherever it runs."""

    def infer(self, inputs: Sequence[np.ndarray], frame_count: int = 1, dump_intermediate: bool = False) -> InferResult:
        raise NotImplementedError

    def perf(self, config: PerfConfig, inputs: Sequence[np.ndarray] = (), progress=None,
             cancel: Optional[threading.Event] = None) -> PerfReport:
        """``progress(done, total, elapsed_s)``; setting ``cancel`` (from any thread) stops the job (Cancelled)."""
        raise NotImplementedError


class LocalModel(ModelHandle):
    def __init__(self, loaded: LoadedModel):
        super().__init__(loaded.model)
        self.loaded = loaded

    def infer(self, inputs, frame_count=1, dump_intermediate=False):
        return run_frames(self.loaded, inputs, frame_count, dump_intermediate)

    def perf(self, config, inputs=(), progress=None, cancel=None):
        return run_perf(self.loaded, inputs, config, progress=progress, cancelled=cancel.is_set if cancel else None)


class RemoteModel(ModelHandle):
    def __init__(self, client: BoardClient, sha: str, model: model_pb2.Model):
        super().__init__(model)
        self.client, self.sha = client, sha

    def infer(self, inputs, frame_count=1, dump_intermediate=False):
        return self.client.infer(self.sha, self.name, list(inputs), self.input_names, dump_intermediate, frame_count)

    def perf(self, config, inputs=(), progress=None, cancel=None):
        return self.client.perf(self.sha, self.name, config, list(inputs), progress=progress, cancel=cancel)


@dataclass(frozen=True)
class Platform:
    """What decides bit-exactness across machines: CPU arch and onnxruntime version."""

    arch: str
    onnxruntime_version: str

    def __str__(self) -> str:
        return f"{self.arch}, onnxruntime {self.onnxruntime_version}"


def local_platform() -> Platform:
    from bpuemu.board.messages import onnxruntime_version

    return Platform(platform.machine(), onnxruntime_version())


# --- one call on every board ---------------------------------------------------------------

@dataclass
class BoardOutcome(Generic[T]):
    """What one board of a call gave: a value, or the error that board hit."""

    target: str
    value: Optional[T] = None
    error: Optional[BpuEmuError] = None

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(targets: Sequence[str], work: Callable[[str], T],
            on_interrupt: Optional[Callable[[], None]] = None) -> List[BoardOutcome[T]]:
    """Run ``work(target)`` for every board at once; outcomes in the order of ``targets``.

    A BpuEmuError is that board's failure; anything else is a bug and propagates.
    One board runs in the caller's thread (Ctrl-C reaches its call directly).
    When the caller is interrupted (Ctrl-C), ``on_interrupt`` runs before waiting
    for the boards' threads, so it can make them stop (cancel their jobs).
    """
    def one(target: str) -> BoardOutcome[T]:
        try:
            return BoardOutcome(target, value=work(target))
        except BpuEmuError as exc:
            return BoardOutcome(target, error=exc)

    if len(targets) <= 1:
        return [one(t) for t in targets]
    pool = ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="board")
    try:
        futures = [pool.submit(one, t) for t in targets]
        return [f.result() for f in futures]
    except BaseException:
        if on_interrupt is not None:
            on_interrupt()
        raise
    finally:
        pool.shutdown(wait=True)


def reason(outcome: BoardOutcome) -> str:
    """Why a board failed, in one line that names the board."""
    first = outcome.error.message.splitlines()[0]
    return first if outcome.target in first else f"{outcome.target}: {first}"


class BoardRun(Generic[T]):
    """One call on every board of a backend: each board's outcome, in board order."""

    def __init__(self, what: str, outcomes: List[BoardOutcome[T]]):
        self.what = what
        self.outcomes = outcomes

    @property
    def ok(self) -> List[BoardOutcome[T]]:
        return [o for o in self.outcomes if o.ok]

    @property
    def failed(self) -> List[BoardOutcome[T]]:
        return [o for o in self.outcomes if not o.ok]

    def failures_line(self) -> str:
        """One line naming every failed board and why (the first line of each error)."""
        return f"{self.what} failed on {len(self.failed)} of {len(self.outcomes)} boards: " + \
            "; ".join(map(reason, self.failed))

    def raise_if_failed(self) -> None:
        """One board: its own error. Several: one error (the first failure's kind) naming every board that failed."""
        failed = self.failed
        if not failed:
            return
        if len(self.outcomes) == 1:
            raise failed[0].error
        raise type(failed[0].error)(self.failures_line())


@dataclass
class BoardModels:
    """model_info on one board: the board (open while its backend is) and the models asked for."""

    backend: "Backend"
    handles: List[ModelHandle]


@dataclass
class BoardInfer:
    """infer on one board: its result and the dumps written (tensor -> files), in ``directory``."""

    backend: "Backend"
    handle: ModelHandle
    result: InferResult
    directory: str
    output_files: Dict[str, List[str]] = field(default_factory=dict)
    intermediate_files: Dict[str, List[str]] = field(default_factory=dict)

    @property
    def files(self) -> List[str]:
        """Every file written, in writing order."""
        return [f for w in (self.output_files, self.intermediate_files) for files in w.values() for f in files]


@dataclass
class Agreement:
    """Whether the boards that answered an infer computed the same outputs, bit for bit."""

    reference: str  # the first board that answered; the others are compared with it
    differ: List[str]  # the boards whose outputs differ from the reference's
    answered: int
    boards: int

    @property
    def identical(self) -> bool:
        return not self.differ


def same_outputs(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> bool:
    """The same output names, in the same order, with bit-identical arrays (dtype and shape included)."""
    return list(a) == list(b) and all(a[n].dtype == b[n].dtype and np.array_equal(a[n], b[n]) for n in a)


class InferRun(BoardRun[BoardInfer]):
    @property
    def agreement(self) -> Optional[Agreement]:
        """None when fewer than two boards answered."""
        ok = self.ok
        if len(ok) < 2:
            return None
        first = ok[0].value.result.outputs
        differ = [o.target for o in ok[1:] if not same_outputs(first, o.value.result.outputs)]
        return Agreement(ok[0].target, differ, len(ok), len(self.outcomes))


@dataclass
class BoardPerf:
    """perf on one board: its report and the profiler files written (names in ``directory``)."""

    backend: "Backend"
    handle: ModelHandle
    report: PerfReport
    directory: str = ""
    profile_files: List[str] = field(default_factory=list)


@dataclass
class PerfSummary:
    """All boards together: frames and FPS summed, latency frame-weighted, percentiles the worst board's."""

    boards: int
    succeeded: int
    frame_count: int
    fps: float
    average_latency_ms: float
    worst_p50_ms: float
    worst_p90_ms: float
    worst_p99_ms: float


class PerfRun(BoardRun[BoardPerf]):
    @property
    def summary(self) -> PerfSummary:
        reports = [o.value.report for o in self.ok]
        frames = sum(r.frame_count for r in reports)
        avg = sum(r.average_latency_ms * r.frame_count for r in reports) / frames if frames else 0.0
        worst = lambda attr: max((getattr(r, attr) for r in reports), default=0.0)  # noqa: E731
        return PerfSummary(len(self.outcomes), len(reports), frames, sum(r.fps for r in reports), avg,
                           worst("p50_ms"), worst("p90_ms"), worst("p99_ms"))


class _SummedProgress:
    """The boards' perf progress as one: ``progress(done, total, elapsed)`` summed over the boards."""

    def __init__(self, progress: Callable[[int, int, float], None]):
        self.progress = progress
        self.done: Dict[str, int] = {}
        self.total: Dict[str, int] = {}
        self.lock = threading.Lock()

    def board(self, target: str) -> Callable[[int, int, float], None]:
        def report(done: int, total: int, elapsed: float) -> None:
            with self.lock:
                self.done[target], self.total[target] = done, total
                self.progress(sum(self.done.values()), sum(self.total.values()), elapsed)
        return report


Inputs = Union[Sequence[np.ndarray], Callable[[ModelHandle], Sequence[np.ndarray]]]


def _inputs_for(handle: ModelHandle, inputs: Inputs) -> List[np.ndarray]:
    return list(inputs(handle) if callable(inputs) else inputs)


PROFILE_FILES = ("profiler.log", "profiler.csv")


class Backend:
    """Where models run: one board (this process, a daemon, SSH) or several (a farm)."""

    description = ""
    load_ms = 0.0
    #: The board's name in results and messages.
    address = "local"

    def __init__(self):
        self.models: Dict[str, ModelHandle] = {}

    @property
    def platform(self) -> Platform:
        """Where the models run (this machine for the local runtime)."""
        return local_platform()

    @property
    def model_names(self) -> List[str]:
        return list(self.models)

    def model(self, name: Optional[str] = None) -> ModelHandle:
        """The model called ``name``; with no name, the only one (NotFound otherwise)."""
        return select_model(self.models, name, "the given model files")

    def _add(self, handle: ModelHandle) -> None:
        if handle.name in self.models:
            raise InvalidInput(f"model name '{handle.name}' appears twice in the given model files")
        self.models[handle.name] = handle

    # --- the same calls on one board or many ---

    def boards(self) -> List[BoardOutcome["Backend"]]:
        """Each board of this backend, opened (its own Backend) or the error that stopped it. Here: itself."""
        return [BoardOutcome(str(self.address), value=self)]

    def board_dir(self, base: str, target: str) -> str:
        """Where one board's files go: ``base`` itself for one board, ``base/<board>`` when there are several."""
        if len(self.boards()) == 1:
            return base
        return os.path.join(base, target.replace("[", "").replace("]", "").replace(":", "_"))

    def _each(self, work: Callable[[str, "Backend"], T], on_interrupt: Optional[Callable[[], None]] = None
              ) -> List[BoardOutcome[T]]:
        opened = {o.target: o for o in self.boards()}

        def one(target: str) -> T:
            board = opened[target]
            if not board.ok:
                raise board.error
            return work(target, board.value)

        return fan_out(list(opened), one, on_interrupt)

    def model_info(self, model_name: Optional[str] = None) -> BoardRun[BoardModels]:
        """The model called ``model_name`` (with none: every model) on each board."""
        def one(target: str, be: "Backend") -> BoardModels:
            return BoardModels(be, [be.model(model_name)] if model_name else [be.models[n] for n in be.model_names])

        return BoardRun("model_info", self._each(one))

    def infer(self, model_name: Optional[str], inputs: Inputs, frame_count: int = 1,
              dump: Optional[DumpConfig] = None, dump_path: str = ".") -> InferRun:
        """One infer on each board; ``inputs``: arrays, or ``inputs(handle) -> arrays``.

        With ``dump``, each board's outputs (and intermediates) are written to
        ``board_dir(dump_path, board)``; ``.agreement`` says whether the boards agree.
        """
        dump = dump or DumpConfig()

        def one(target: str, be: "Backend") -> BoardInfer:
            h = be.model(model_name)
            result = h.infer(_inputs_for(h, inputs), frame_count=frame_count,
                             dump_intermediate=dump.intermediate > 0)
            where = self.board_dir(dump_path, target)
            outputs, intermediates = dump.write(where, h.model, h.name, result)
            return BoardInfer(be, h, result, where, outputs, intermediates)

        return InferRun("infer", self._each(one))

    def perf(self, model_name: Optional[str], config: PerfConfig, inputs: Inputs = (),
             progress: Optional[Callable[[int, int, float], None]] = None, profile_path: str = "",
             cancel: Optional[threading.Event] = None) -> PerfRun:
        """The same perf job on every board at once; ``.summary`` is all boards together.

        ``inputs`` empty: the boards make random inputs. ``progress(done, total,
        elapsed_s)`` is summed over the boards. With ``profile_path`` (and
        ``config.profile``), each board's profiler.log/csv go to
        ``board_dir(profile_path, board)``. ``cancel`` (or an interrupt of the
        caller) stops every board's job.
        """
        cancel = cancel if cancel is not None else threading.Event()
        summed = _SummedProgress(progress) if progress is not None else None

        def one(target: str, be: "Backend") -> BoardPerf:
            h = be.model(model_name)
            report = h.perf(config, _inputs_for(h, inputs), progress=summed.board(target) if summed else None,
                            cancel=cancel)
            run = BoardPerf(be, h, report)
            if profile_path:
                run.directory = self.board_dir(profile_path, target)
                os.makedirs(run.directory, exist_ok=True)
                for name, text in zip(PROFILE_FILES, (report.profiler_log, report.profiler_csv)):
                    write_file_atomic(os.path.join(run.directory, name), text)
                    run.profile_files.append(name)
            return run

        return PerfRun("perf", self._each(one, on_interrupt=cancel.set))

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalBackend(Backend):
    def __init__(self, model_files: Sequence[str], intra_op_threads: int = 1, march: Optional[str] = None):
        super().__init__()
        self.runtime = Runtime(intra_op_threads, march=march)   # march: Runtime's (this process's board by default)
        self.load_ms = self._timed_load(model_files)
        self.description = f"local runtime ({self.platform})"

    def _timed_load(self, files) -> float:
        t0 = time.perf_counter()
        self.runtime.load(list(files))
        for loaded in self.runtime.models.values():
            self._add(LocalModel(loaded))
        return (time.perf_counter() - t0) * 1e3


class RemoteBackend(Backend):
    def __init__(self, target: str, model_files: Sequence[str], token: Optional[str] = None, tls=None,
                 deadlines: Optional[Deadlines] = None, client_name: str = "hrt_model_exec"):
        super().__init__()
        # tls: a bpuemu.board.security.TlsConfig, or None (then BPUEMU_TLS_*, else plain TCP)
        self.client = BoardClient(target, token=token, client_name=client_name, tls=tls,
                                  deadlines=deadlines)
        try:
            self.address = self.client.target
            info = self.client.info
            self.description = f"board {self.client.target} ({info.arch}, bpuemu {info.daemon_version})"
            t0 = time.perf_counter()
            for path in model_files:
                sha = self.client.ensure_model(path)
                for name in self.client.load(sha):
                    self._add(RemoteModel(self.client, sha, self.client.model_info(sha, name)))
            self.load_ms = (time.perf_counter() - t0) * 1e3
        except BaseException:
            self.client.close()
            raise

    @property
    def platform(self) -> Platform:
        info = self.client.info
        return Platform(info.arch, info.onnxruntime_version)

    def close(self) -> None:
        self.client.close()


@dataclass(frozen=True)
class TransportRequest:
    """A board reached through a transport plugin: the plugin's name, the target, and its own settings.

    The board knows no plugin's option types (SSH's live on the host, with
    paramiko); the plugin's ``open(request, model_files)`` turns ``settings``
    into them.
    """

    transport: str  # the plugin's name in the bpuemu.transports group, e.g. "ssh"
    target: str  # e.g. "root@board:22"
    settings: Mapping[str, object] = field(default_factory=dict)


#: Entry point group where host packages register extra transports.
TRANSPORT_GROUP = "bpuemu.transports"


def load_transport(name: str):
    """The Backend class registered as transport ``name`` (e.g. "ssh")."""
    from importlib.metadata import entry_points

    eps = entry_points()
    group = eps.select(group=TRANSPORT_GROUP) if hasattr(eps, "select") else eps.get(TRANSPORT_GROUP, [])
    hint = "install the host side: pip install 'bpuemu[host]' (paramiko)"
    found = [ep for ep in group if ep.name == name]
    if not found:
        raise InvalidInput(f"the {name} transport is not installed here", hint=hint)
    try:
        return found[0].load()
    except ImportError as exc:
        raise InvalidInput(f"the {name} transport cannot be loaded: {exc}", hint=hint) from None
