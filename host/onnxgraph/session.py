"""The one way the host opens an onnxruntime session on a model.

By default a session gets the board runtime's options
(``bpuemu.board.runtime.sessions.session_options``: QDQ fusion off, no
spinning): with onnxruntime's defaults a quantized model computes something
else than the board, whose pieces run with those options (DESIGN.md,
"Numerical contract"). A caller that wants onnxruntime's own behaviour says so
with ``board_options=False`` (checking that a model loads in stock
onnxruntime) and may pass its own ``options`` then (the optimizer's saved
basic-level graph).
"""
import abc
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, TypeVar, Union

import numpy as np
import onnx

from bpuemu.common.errors import InvalidInput
from bpuemu.common.tensor import ORT_DTYPES

T = TypeVar("T")


def open_session(model: Union[onnx.ModelProto, bytes], options=None, *, board_options: bool = True,
                 intra_op_threads: int = 1, what: str = "the model", arena: str = "session"):
    """An onnxruntime CPU session on ``model`` (a ModelProto or its serialized bytes).

    ``board_options``: the board runtime's session options with
    ``intra_op_threads``; False: ``options`` (an ``onnxruntime.SessionOptions``)
    or, without them, onnxruntime's defaults. A model onnxruntime refuses is an
    InvalidInput naming ``what``. ``arena``: where the session's tensors live: ``"session"``, its
    own onnxruntime memory arena (kept, at the size of its largest run, until the session goes);
    ``"shared"``, the one arena of the process's sessions that ask for it (``shared_arena``): the
    memory one such session's run freed serves the next one, so a model cut into parts
    (``parts.Parts``) holds one part's tensors rather than one arena per part, and the calibration's
    stages reuse each other's pages; ``"none"``, no arena (plain malloc). The values are the same.
    """
    import onnxruntime as ort

    if board_options:
        if options is not None:
            raise ValueError("options are the board runtime's unless board_options=False")
        from bpuemu.board.runtime.sessions import session_options

        options = session_options(intra_op_threads)
        if arena == "shared" and shared_arena():
            options.add_session_config_entry("session.use_env_allocators", "1")
        elif arena != "session":
            options.enable_cpu_mem_arena = False
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    try:
        return ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's exception types vary by version
        raise InvalidInput(f"onnxruntime cannot load {what}: {exc}") from None


_SHARED = {"lock": threading.Lock(), "ready": None}


def shared_arena() -> bool:
    """Register, once per process, the CPU memory arena that sessions opened with ``arena="shared"``
    use (onnxruntime's environment allocator); False when this onnxruntime cannot (those sessions
    then run without an arena). The arena keeps the largest memory its sessions used at once for
    the life of the process, as every session's own arena does for the session's life."""
    with _SHARED["lock"]:
        if _SHARED["ready"] is None:
            import onnxruntime as ort

            try:
                info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
                ort.create_and_register_allocator(info, ort.OrtArenaCfg({}))
                _SHARED["ready"] = True
            except Exception as exc:  # noqa: BLE001 -- an older build, or registered already by the embedding program
                _SHARED["ready"] = "already" in str(exc).lower()
        return bool(_SHARED["ready"])


def feed_for(sess, sample: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """``sample`` cast to each session input's type (X_128 floats -> int8 for a quantized model)."""
    feed = {}
    for i in sess.get_inputs():
        if i.name not in sample:
            raise InvalidInput(f"calibration sample has no data for input '{i.name}' (has {sorted(sample)})")
        x = np.asarray(sample[i.name])
        dtype = ORT_DTYPES.get(i.type, np.dtype(np.float32))
        if np.issubdtype(dtype, np.integer) and not np.issubdtype(x.dtype, np.integer):
            info = np.iinfo(dtype)
            x = np.clip(np.rint(x), info.min, info.max)
        feed[i.name] = np.ascontiguousarray(x.astype(dtype, copy=False))
    return feed


class PartedSession(abc.ABC):
    """What runs a model as consecutive parts (``parts.Parts``) where a session would run it whole:
    ``get_inputs()`` as a session's, and ``run(feed, consume)`` calling ``consume({name: value})``
    once per part with that part's tensors. ``imap_samples`` takes either."""

    @abc.abstractmethod
    def get_inputs(self):
        """The model inputs' NodeArgs (name and type), as a session lists them."""

    @abc.abstractmethod
    def run(self, feed: Mapping[str, np.ndarray], consume: Callable[[Dict[str, np.ndarray]], None]) -> None:
        """``consume(values)`` for each part's tensors of one run on ``feed``."""


def sample_workers() -> int:
    """How many samples the host runs at once: one per core, at most 2 (each run is one
    onnxruntime thread with the board's options, so N workers keep N cores busy);
    ``BPUEMU_HOST_THREADS`` overrides it (1: everything in the calling thread)."""
    env = os.environ.get("BPUEMU_HOST_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, min(2, os.cpu_count() or 1))


def imap_samples(sess, names: Optional[Sequence[str]], samples: Sequence[Mapping[str, np.ndarray]],
                 fn: Optional[Callable[[int, List[np.ndarray]], T]] = None, workers: Optional[int] = None) -> Iterator[T]:
    """``map_samples`` yielding each sample's result in sample order as soon as it is there, so a
    caller adding them up never holds every sample's result (a histogram per tensor per sample:
    300 MB over 100 samples of PP-OCRv4 det). ``sess`` may be a ``PartedSession`` (``parts.Parts``): ``fn`` then gets
    ``(i, values)`` once per part, with that part's ``{name: value}``, and the sample's result is
    the dict of what those calls returned, merged (``names`` is then unused)."""

    def one(i: int):
        if isinstance(sess, PartedSession):
            merged: dict = {}
            sess.run(feed_for(sess, samples[i]), lambda values: merged.update(fn(i, values)))
            return merged
        values = sess.run(names, feed_for(sess, samples[i]))
        return fn(i, values) if fn is not None else values

    n = len(samples)
    workers = min(workers or sample_workers(), n)
    if workers <= 1:
        for i in range(n):
            yield one(i)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="bpuemu-sample") as pool:
        # At most 2 x workers samples in flight: results wait for the caller only that long.
        pending = [pool.submit(one, i) for i in range(min(n, 2 * workers))]
        for i in range(n):
            result = pending[i].result()
            pending[i] = None
            if i + 2 * workers < n:
                pending.append(pool.submit(one, i + 2 * workers))
            yield result


def map_samples(sess, names: Optional[Sequence[str]], samples: Sequence[Mapping[str, np.ndarray]],
                fn: Optional[Callable[[int, List[np.ndarray]], T]] = None, workers: Optional[int] = None) -> List[T]:
    """``fn(i, sess.run(names, feed_for(sess, samples[i])))`` for every sample, in sample order.

    The runs spread over ``workers`` threads (``sample_workers()`` by default):
    onnxruntime releases the GIL while it runs and one session serves concurrent
    runs, each run computes exactly what it computes alone, and so does ``fn``
    (numpy releases the GIL too), so the results are those of the sequential
    loop. ``fn`` runs in the worker, so a caller that reduces each sample's
    outputs (statistics, cosines) never holds more than ``workers`` samples'
    outputs at once. Without ``fn`` the outputs themselves are returned.
    """
    return list(imap_samples(sess, names, samples, fn, workers))
