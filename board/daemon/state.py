"""The board's library API behind the gRPC service: store, loaded models, jobs.

Everything here is plain Python that raises BpuEmuErrors; the service module
only adapts messages. Limits (upload size, concurrent jobs, perf caps) are
enforced here so every entry point shares them.
"""
import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from bpuemu.common.container import BinFile, decode_bin
from bpuemu.common.errors import IncompatibleVersion, InvalidInput, ResourceExhausted
from bpuemu.common.version import API_VERSION, __version__
from bpuemu.board.daemon import memory
from bpuemu.board.daemon.store import ModelStore, check_sha
from bpuemu.board.runtime import InferResult, Runtime, run_frames

log = logging.getLogger("bpuemu.board.daemon")


@dataclass
class Limits:
    """What one board lets its callers use. Each limit is one clear error when hit.

    They guard against mistakes and overload by callers that passed the token
    check; unauthenticated calls are refused before any of this runs.
    """

    max_model_bytes: int = 1 << 30  # one upload (RESOURCE_EXHAUSTED)
    max_jobs: int = 4               # infer + perf calls running at once (RESOURCE_EXHAUSTED)
    max_frame_count: int = 1_000_000  # frame_count of one infer or perf (INVALID_ARGUMENT)
    max_perf_time_minutes: float = 60.0  # perf_time of one perf (INVALID_ARGUMENT)
    # Uploads of distinct models in progress at once, over all callers (RESOURCE_EXHAUSTED);
    # another upload of a model in progress waits for it. Bounds the store's temporary
    # space to max_uploads x max_model_bytes.
    max_uploads: int = 4
    # Open data channel connections (RESOURCE_EXHAUSTED at HELLO); each holds a thread.
    max_data_connections: int = 64
    # Seconds a caller has to send a request and take its reply, plus a second per MiB (DEADLINE_EXCEEDED):
    # an upload, an infer on the data channel. Bounds how long a slow or stalled caller holds a thread.
    call_deadline_s: float = 60.0
    # Bytes of all the models in the store; an upload past it evicts the least recently used models not loaded,
    # or is refused (RESOURCE_EXHAUSTED). 0: no limit.
    max_store_bytes: int = 8 << 30
    # Models loaded at once; loading one more unloads the least recently used.
    max_loaded_models: int = 16
    # Bytes the data channel's large requests (over 16 MiB) of all connections may hold at once
    # (RESOURCE_EXHAUSTED past it); each holds at most bpuemu.common.wire.MAX_MESSAGE_BYTES.
    max_data_buffer_bytes: int = 1 << 30

    def transfer_s(self, nbytes: int) -> float:
        """Seconds a caller has to move ``nbytes`` (a request, a reply, an upload): call_deadline_s plus a second
        per MiB, i.e. at least 1 MiB/s (clients give themselves less: BoardClient's Deadlines)."""
        return self.call_deadline_s + nbytes / (1 << 20)


class Stats:
    """Counters a board reports through GetStats (how a farm sees where its load went) and its metrics."""

    FIELDS = ("infer_calls", "infer_frames", "infer_errors", "perf_jobs", "uploads", "refused_busy", "upload_bytes")
    #: Counted for the metrics only (no BoardStats field).
    METRICS_ONLY = ("perf_frames",)

    def __init__(self):
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.FIELDS + self.METRICS_ONLY, 0)
        self.started = time.monotonic()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def board_stats(self) -> Dict[str, int]:
        """The BoardStats fields."""
        counts = self.snapshot()
        return {name: counts[name] for name in self.FIELDS}


class LoadedFile:
    def __init__(self, binfile: BinFile, runtime: Runtime, size: int):
        self.binfile = binfile
        self.runtime = runtime
        self.size = size
        self.last_used = time.monotonic()  # which loaded model goes first past Limits.max_loaded_models


class BoardState:
    def __init__(self, model_dir: str, limits: Optional[Limits] = None, intra_op_threads: int = 1):
        self.limits = limits = limits or Limits()
        self.stats = Stats()
        self.store = ModelStore(model_dir, limits.max_model_bytes, limits.max_uploads,
                                on_bytes=lambda n: self.stats.add("upload_bytes", n),
                                max_store_bytes=limits.max_store_bytes, in_use=self.is_loaded)
        self.intra_op_threads = intra_op_threads
        self._loaded: Dict[str, LoadedFile] = {}
        self._lock = threading.Lock()
        self._slots_taken = 0  # job slots in use, of limits.max_jobs
        self._running: Dict[str, int] = {}  # by kind ("infer", "perf"): calls in a job slot
        self._queued: Dict[str, int] = {}   # by kind: calls accepted, not yet in a slot (loading their model)

    @staticmethod
    def check_client(api_version: int, client_version: str) -> None:
        if api_version != API_VERSION:
            raise IncompatibleVersion(
                f"client bpuemu {client_version or '?'} speaks board API v{api_version}, "
                f"this daemon (bpuemu {__version__}) speaks v{API_VERSION}",
                hint="install the same bpuemu major version on host and board",
            )

    def load(self, sha: str) -> LoadedFile:
        if type(sha) is str:  # a loaded model's id was checked when it was loaded
            with self._lock:
                loaded = self._loaded.get(sha)
            if loaded is not None:
                loaded.last_used = time.monotonic()
                return loaded
        check_sha(sha)
        data = self.store.read(sha)
        binfile = decode_bin(data, source=f"model {sha[:12]}")
        runtime = Runtime(self.intra_op_threads)
        runtime.load([binfile])
        self.store.touch(sha)  # recently used: the last the store's quota evicts
        with self._lock:
            loaded = self._loaded.setdefault(sha, LoadedFile(binfile, runtime, len(data)))
            evicted = self._over_loaded_limit(sha)
        log.info("loaded model %s (%s)", sha[:12], ", ".join(runtime.model_names))
        if evicted:
            log.info("unloaded model(s) %s: over --max-loaded-models %d", ", ".join(e[:12] for e in evicted),
                     self.limits.max_loaded_models)
            memory.trim()
        return loaded

    def _over_loaded_limit(self, keep: str) -> List[str]:
        """Under self._lock: unload the least recently used models (never ``keep``) past max_loaded_models."""
        evicted = []
        while len(self._loaded) > self.limits.max_loaded_models:
            oldest = min((lf.last_used, sha) for sha, lf in self._loaded.items() if sha != keep)[1]
            del self._loaded[oldest]  # a call still running it keeps its own reference
            evicted.append(oldest)
        return evicted

    def load_as_job(self, sha: str, kind: str = "load") -> LoadedFile:
        """``load``, in a job slot of its own when the model is not loaded yet (a load builds sessions: as much
        work and memory as a job), counted as a call of ``kind`` queued while it loads."""
        with self._lock:
            loaded = self._loaded.get(sha) if type(sha) is str else None
        if loaded is not None:
            loaded.last_used = time.monotonic()
            return loaded
        with self.job("load"), self.queued(kind):
            return self.load(sha)

    def unload(self, sha: str) -> bool:
        check_sha(sha)
        with self._lock:
            loaded = self._loaded.pop(sha, None)
        if loaded is None:
            return False
        # Its sessions are freed here (unless a call still runs them): their pages go back to the kernel,
        # not into the holes of a malloc arena (bpuemu.board.daemon.memory).
        del loaded
        memory.trim()
        return True

    def is_loaded(self, sha: str) -> bool:
        with self._lock:
            return sha in self._loaded

    def loaded_sizes(self) -> Dict[str, int]:
        """The size of each loaded model's .bin, by SHA-256."""
        with self._lock:
            return {sha: lf.size for sha, lf in self._loaded.items()}

    def loaded_names(self, sha: str) -> List[str]:
        with self._lock:
            lf = self._loaded.get(sha)
        return lf.runtime.model_names if lf else []

    def infer(self, sha: str, model_name: str, inputs: Sequence[np.ndarray], frame_count: int = 1,
              dump_intermediate: bool = False, is_active: Optional[Callable[[], bool]] = None) -> InferResult:
        """One infer call (the gRPC Infer method or the data channel): in a job slot,
        within the frame limit, counted in GetStats."""
        self.stats.add("infer_calls")
        try:
            model = self.load_as_job(sha, "infer").runtime.model(model_name)
            frames = max(1, frame_count)
            if frames > self.limits.max_frame_count:
                raise InvalidInput(f"frame_count {frames} is over this board's limit of {self.limits.max_frame_count}")
            self._take_slot("infer")
            try:
                return run_frames(model, inputs, frames, dump_intermediate, is_active,
                                  on_frame=lambda: self.stats.add("infer_frames"))
            finally:
                self._free_slot("infer")
        except BaseException:
            self.stats.add("infer_errors")
            raise

    @contextmanager
    def job(self, what: str):
        """Hold one of the board's job slots, or fail at once when all are busy."""
        self._take_slot(what)
        try:
            yield
        finally:
            self._free_slot(what)

    def _take_slot(self, what: str) -> None:
        """Take a job slot for a call of kind ``what`` (one lock: this is on every infer's path)."""
        with self._lock:
            if self._slots_taken < self.limits.max_jobs:
                self._slots_taken += 1
                self._running[what] = self._running.get(what, 0) + 1
                return
        self.stats.add("refused_busy")
        raise ResourceExhausted(
            f"board is busy: {self.limits.max_jobs} jobs already running; {what} refused",
            hint="retry later, or start hrt_boardd with a larger --max-jobs",
        )

    def _free_slot(self, what: str) -> None:
        with self._lock:
            self._slots_taken -= 1
            self._running[what] -= 1

    def queued(self, what: str):
        """Count a call as accepted but not yet in a job slot (while it loads its model)."""
        return self._count(self._queued, what)

    @contextmanager
    def _count(self, table: Dict[str, int], what: str):
        with self._lock:
            table[what] = table.get(what, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                table[what] -= 1

    @property
    def slots_taken(self) -> int:
        """Job slots in use now, read without the lock: a snapshot for a heuristic (the data channel's placing
        of its threads)."""
        return self._slots_taken

    @property
    def jobs_running(self) -> int:
        """Infer and perf calls running (loads take slots too, but are not jobs a caller ran)."""
        with self._lock:
            return sum(n for kind, n in self._running.items() if kind != "load")

    def jobs_by_kind(self) -> Tuple[Dict[str, int], Dict[str, int]]:
        """(running, queued) calls by kind ("infer", "perf")."""
        with self._lock:
            return dict(self._running), dict(self._queued)
