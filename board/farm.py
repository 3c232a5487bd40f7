"""A board farm: several independent hrt_boardd daemons driven from one host.

    boards = parse_boards("10.0.0.1:9473,10.0.0.2:9473")   # or "@boards.txt"
    outcomes = farm_perf(boards, ["m.bin"], "", PerfConfig(frame_count=200))
    summary = summarize(outcomes)                         # FPS summed over boards
    with FarmClient(boards) as farm:
        sha = farm.prepare("m.bin")                       # upload + load on every board
        farm.infer(sha, "", [x])                          # spread by gRPC round_robin

Fan-out (``fan_out``): one thread and one BoardClient per board; a board that
fails (unreachable, restarted mid-job, refused) becomes that board's
``BoardOutcome.error`` and the other boards' results are kept.

Infer load (``FarmClient``): one gRPC channel over all the boards' addresses
with the ``round_robin`` load-balancing policy (bpuemu.board.client), so gRPC
itself spreads consecutive calls over the boards, and skips a board that is
down. The data channel is a plain connection to one board, which gRPC cannot
balance; the farm client uses gRPC Infer only (per-board clients still use
their data channels for everything else they do). Every board must hold the
model first: ``prepare`` uploads and loads it on each board.

Over TLS the round-robin channel checks every board's certificate against one
name (gRPC has one authority per channel): ``--tls-server-name``, else the
first board's host. Give the farm's boards certificates that carry a shared
name (for example the Kubernetes headless Service's), or address them by IPs
that all their certificates list.

A board list file holds one HOST:PORT per line; ``#`` starts a comment.
"""
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, Generic, List, Optional, Sequence, TypeVar, Union

import numpy as np

from bpuemu.common.errors import BpuEmuError, InvalidInput
from bpuemu.common.proto import board_pb2
from bpuemu.common.wire import join_target, split_target
from bpuemu.board.backends import RemoteBackend
from bpuemu.board.client import BoardClient, Deadlines
from bpuemu.board.runtime.infer import InferResult
from bpuemu.board.runtime.perf_job import PerfConfig, PerfReport
from bpuemu.board.security import TlsConfig

T = TypeVar("T")


def _board_list_file(path: str) -> List[str]:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise InvalidInput(f"cannot read board list {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"board list {path} is not text") from None
    entries = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        entries += [e.strip() for e in line.split(",") if e.strip()]
    if not entries:
        raise InvalidInput(f"board list {path} names no board", hint="write one HOST:PORT per line (# starts a comment)")
    return entries


#: The scheme of a board running hrt_boardd (gRPC); a bare HOST:PORT in --board means the same.
GRPC_SCHEME = "grpc://"


def board_entries(spec: str) -> List[str]:
    """The entries of a board list: ``a,b`` and ``@FILE`` (one per line, ``#`` comments) expanded, as written."""
    entries = []
    for part in (spec or "").split(","):
        part = part.strip()
        if part.startswith("@"):
            entries += _board_list_file(part[1:])
        elif part:
            entries.append(part)
    return entries


def parse_boards(spec: str) -> List[str]:
    """Boards from ``--board``: ``HOST:PORT[,HOST:PORT...]`` or ``@FILE``; normalized, no duplicates.

    An entry may carry the ``grpc://`` scheme (what hb_verifier needs to tell a
    daemon from an SSH board); another scheme is refused.
    """
    boards = []
    for entry in board_entries(spec):
        address = entry[len(GRPC_SCHEME):] if entry.startswith(GRPC_SCHEME) else entry
        if "://" in address:
            raise InvalidInput(f"bad board address '{entry}': a board running hrt_boardd is HOST:PORT or grpc://HOST:PORT")
        try:
            board = join_target(*split_target(address))
        except ValueError as exc:
            raise InvalidInput(f"bad board address '{entry}': {exc}", hint="use HOST:PORT, e.g. 127.0.0.1:9473") from None
        if board in boards:
            raise InvalidInput(f"board {board} is listed twice")
        boards.append(board)
    return boards


@dataclass
class BoardAccess:
    """How to reach the boards: the same token, TLS and deadlines for each."""

    token: Optional[str] = None          # None: $BPUEMU_TOKEN
    tls: Optional[TlsConfig] = None      # None: $BPUEMU_TLS_*, else plain TCP
    deadlines: Deadlines = field(default_factory=Deadlines)
    client_name: str = "bpuemu-farm"

    def client(self, target: str, data_channel: bool = True) -> BoardClient:
        return BoardClient(target, token=self.token, deadlines=self.deadlines, client_name=self.client_name,
                           data_channel=data_channel, tls=self.tls)

    def backend(self, target: str, model_files: Sequence[str]) -> RemoteBackend:
        """The models on one board (uploaded and loaded), reached with these settings."""
        return RemoteBackend(target, model_files, self.token, self.tls, deadlines=self.deadlines,
                             client_name=self.client_name)


@dataclass
class BoardOutcome(Generic[T]):
    """What one board of a fan-out gave: a value, or the error that board hit."""

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
    When the caller is interrupted (Ctrl-C), ``on_interrupt`` runs before waiting
    for the boards' threads, so it can make them stop (cancel their jobs).
    """
    def one(target: str) -> BoardOutcome[T]:
        try:
            return BoardOutcome(target, value=work(target))
        except BpuEmuError as exc:
            return BoardOutcome(target, error=exc)

    if not targets:
        return []
    pool = ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="farm")
    try:
        futures = [pool.submit(one, t) for t in targets]
        return [f.result() for f in futures]
    except BaseException:
        if on_interrupt is not None:
            on_interrupt()
        raise
    finally:
        pool.shutdown(wait=True)


def failures_line(what: str, outcomes: Sequence[BoardOutcome]) -> str:
    """One line naming every failed board and why (first line of each error)."""
    failed = [o for o in outcomes if not o.ok]
    return f"{what} failed on {len(failed)} of {len(outcomes)} boards: " + "; ".join(map(reason, failed))


def reason(outcome: BoardOutcome) -> str:
    """Why a board failed, in one line that names the board."""
    first = outcome.error.message.splitlines()[0]
    return first if outcome.target in first else f"{outcome.target}: {first}"


# --- perf on every board ---------------------------------------------------------------

@dataclass
class BoardPerf:
    target: str
    description: str  # "x86_64, bpuemu 0.1.0"
    report: PerfReport


def farm_perf(targets: Sequence[str], model_files: Sequence[str], model_name: str, config: PerfConfig,
              inputs: Union[Sequence[np.ndarray], Callable] = (), access: Optional[BoardAccess] = None,
              progress: Optional[Callable[[str, int, int, float], None]] = None,
              cancel: Optional[threading.Event] = None) -> List[BoardOutcome[BoardPerf]]:
    """The same perf job on every board at once (each uploads and loads the model first).

    ``inputs``: arrays, or ``inputs(model_handle) -> arrays`` (empty: the boards
    make random inputs); ``progress(target, done, total, elapsed_s)``;
    ``cancel`` stops every board's job (so does an interrupt of the caller).
    """
    cancel = cancel if cancel is not None else threading.Event()
    access = access or BoardAccess()

    def one(target: str) -> BoardPerf:
        with access.backend(target, model_files) as backend:
            handle = backend.model(model_name)
            info = backend.client.info
            report = backend.client.perf(
                handle.sha, handle.name, config, list(inputs(handle) if callable(inputs) else inputs), cancel=cancel,
                progress=(lambda d, t, e: progress(target, d, t, e)) if progress else None)
            return BoardPerf(target, f"{info.arch}, bpuemu {info.daemon_version}", report)

    return fan_out(targets, one, on_interrupt=cancel.set)


@dataclass
class FarmPerfSummary:
    """All boards together: frames and FPS summed, latency frame-weighted, percentiles the worst board's."""

    boards: int
    succeeded: int
    frame_count: int
    fps: float
    average_latency_ms: float
    worst_p50_ms: float
    worst_p90_ms: float
    worst_p99_ms: float


def summarize(outcomes: Sequence[BoardOutcome[BoardPerf]]) -> FarmPerfSummary:
    reports = [o.value.report for o in outcomes if o.ok]
    frames = sum(r.frame_count for r in reports)
    avg = sum(r.average_latency_ms * r.frame_count for r in reports) / frames if frames else 0.0
    worst = lambda attr: max((getattr(r, attr) for r in reports), default=0.0)  # noqa: E731
    return FarmPerfSummary(len(outcomes), len(reports), frames, sum(r.fps for r in reports), avg,
                           worst("p50_ms"), worst("p90_ms"), worst("p99_ms"))


def profile_dir(base: str, target: str) -> str:
    """Where one board's profiler.log/csv go when several boards share --profile_path."""
    return os.path.join(base, target.replace("[", "").replace("]", "").replace(":", "_"))


# --- infer spread over the farm -----------------------------------------------------------

class FarmClient:
    """Every board of a farm: one client per board, plus one round-robin channel for infer."""

    def __init__(self, targets: Sequence[str], access: Optional[BoardAccess] = None):
        access = access or BoardAccess()
        if not targets:
            raise InvalidInput("a farm needs at least one board")
        self.targets = list(targets)
        self.boards: Dict[str, BoardClient] = {}
        try:
            for t in self.targets:
                self.boards[t] = access.client(t)
            self.balanced = access.client(",".join(self.targets), data_channel=False)
        except BaseException:
            self.close()
            raise

    def prepare(self, model_path: str) -> str:
        """Upload (when missing) and load the model on every board; its SHA-256.

        Every board must take it: the first failure is raised, naming its board.
        """
        def one(target: str) -> str:
            board = self.boards[target]
            board.info  # the version handshake, with each board
            sha = board.ensure_model(model_path)
            board.load(sha)
            return sha

        outcomes = fan_out(self.targets, one)
        failed = [o for o in outcomes if not o.ok]
        if failed:
            raise type(failed[0].error)(failures_line(f"preparing {os.path.basename(model_path)}", outcomes))
        return outcomes[0].value

    def infer(self, sha: str, model_name: str, inputs: Sequence[np.ndarray], input_names: Sequence[str] = (),
              frame_count: int = 1) -> InferResult:
        """One infer on whichever board gRPC's round_robin picks next."""
        return self.balanced.infer(sha, model_name, inputs, input_names, frame_count=frame_count)

    def stats(self) -> Dict[str, board_pb2.BoardStats]:
        return {t: self.boards[t].stats() for t in self.targets}

    def close(self) -> None:
        for client in list(self.boards.values()) + ([self.balanced] if hasattr(self, "balanced") else []):
            client.close()

    def __enter__(self) -> "FarmClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
