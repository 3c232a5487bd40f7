"""The board's model store: `.bin` files kept by the SHA-256 of their bytes.

A model lives at ``<model_dir>/<sha256>.bin`` (plus ``<sha256>.json`` with the
uploader's file name). Uploads go to a partial file in the same directory
(``.upload-<sha256>``) and are renamed into place only when their size and
SHA-256 match, so the store never holds a partial or corrupt model, whatever
the client does.

Resumable uploads: an upload that asked for it (``UploadHeader.resumable``)
and is cut short by its caller or its link (cancelled, deadline) keeps its
partial file, and the next upload of that SHA-256 may
continue from its length (``partial_bytes``, ``begin_upload(offset=...)``)
instead of from byte 0. An upload that sent wrong bytes (more than announced,
a SHA-256 mismatch, not a model) or hit a full disk drops it. Partial files
are bounded: at most ``max_uploads`` of them exist at once (an idle one, the
oldest first, goes to make room), each at most ``max_model_bytes``.
Names come only from validated hex digests, so no request can reach a path
outside the store. The uploader's file name is kept only as display text
(``display_file_name``: no directories, no control characters, at most 255
characters) and is never used to build a path.

A full disk (ENOSPC, a quota, or a file-size limit: EFBIG) during an upload
is RESOURCE_EXHAUSTED; the temporary file goes, the models already stored
stay. The metadata file is published (by rename) before the model, and a
restart removes what a crash between the two renames left: a ``.json``
without its ``.bin``.

A model is data: an upload whose ONNX pieces would read a file of the board
(external data, bpuemu.board.runtime.piece_guard) is refused before it is
published (``check_pieces``), and the runtime checks again at load.

The store's total size is bounded (``max_store_bytes``, hrt_boardd
--max-store-mb): an upload that would pass it first removes the models used
least recently (by the .bin's access time, set at each load) that are not loaded
now, and is refused with RESOURCE_EXHAUSTED when that is not enough
(``_reserve_room``). Uploads in progress count with their announced size.

At most ``max_uploads`` uploads run at once (over all callers); one more is
refused with RESOURCE_EXHAUSTED, so the temporary files never take more than
max_uploads x max_model_bytes. Uploads of one model share the work: while an
upload of a SHA-256 runs, another of the same SHA-256 takes no slot and waits
(leaving its stream unread) until the first ends. If the first published the
model, the waiter answers "already present"; if it failed (its client died
mid-stream), the waiter takes over and stores the model from its own stream.
At most ``WAITERS_PER_SLOT`` x ``max_uploads`` callers wait at once, so one
model sent by many clients cannot take all the daemon's worker threads.
"""
import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from bpuemu.common.atomic import write_file_atomic
from bpuemu.common.container import decode_bin
from bpuemu.common.errors import Cancelled, InvalidInput, InvalidModelFile, NotFound, ResourceExhausted
from bpuemu.board.runtime.piece_guard import check_piece

log = logging.getLogger("bpuemu.board.daemon")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_PARTIAL_PREFIX = ".upload-"  # + the SHA-256: an upload's partial file
#: write() errors that mean "no room for this model here".
_NO_SPACE = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
#: How often a caller waiting for another upload of its model checks that it is still wanted.
_WAIT_POLL_S = 0.2
#: Callers that may wait for other uploads of their model, per upload slot.
WAITERS_PER_SLOT = 4


def display_file_name(name) -> str:
    """The uploader's file name as the store keeps and lists it: display text, never a path."""
    if not isinstance(name, str):
        return ""
    base = re.split(r"[\\/]", name)[-1]
    base = "".join(c for c in base if c.isprintable())[:255]
    return "" if base in (".", "..") else base


def check_sha(sha: str) -> str:
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise InvalidInput(f"'{str(sha)[:80]}' is not a model id (64 lowercase hex digits of SHA-256)")
    return sha


@dataclass
class StoredModel:
    sha256: str
    size: int
    file_name: str


class OffsetMismatch(Exception):
    """An upload's offset is not what the board holds of that model (``held`` bytes): nothing was stored."""

    def __init__(self, held: int):
        super().__init__(held)
        self.held = held


class UploadIncomplete(InvalidInput):
    """An upload's stream ended before all the announced bytes came: what came may be resumed."""


class Upload:
    """One upload in progress into its model's partial file; ``commit`` publishes it, ``abort`` ends it.

    ``offset``: the data starts at this byte (a resumed upload); it must equal what the partial file
    holds (else OffsetMismatch), and 0 starts afresh.
    """

    def __init__(self, store: "ModelStore", sha256: str, size: int, file_name: str, offset: int = 0):
        self.store, self.sha256, self.size, self.file_name = store, sha256, size, display_file_name(file_name)
        self._holds_slot = True  # taken by ModelStore.begin_upload
        self.tmp_path = store.partial_path(sha256)
        self.offset = offset
        self.received = 0
        try:
            self._file, self._hash = self._open_partial(offset)
        except BaseException:
            self._release()
            raise

    def _open_partial(self, offset: int):
        """The partial file, positioned at ``offset``, and the SHA-256 of the bytes before it."""
        held = self.store.partial_bytes(self.sha256)
        if offset == 0:
            return open(self.tmp_path, "wb"), hashlib.sha256()
        if offset != held or offset > self.size:
            raise OffsetMismatch(held if held <= self.size else 0)
        f = open(self.tmp_path, "r+b")
        digest = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
        log.info("upload of %s resumes at byte %d of %d", self.sha256[:12], offset, self.size)
        return f, digest

    @property
    def position(self) -> int:
        """Bytes of the file the board holds now."""
        return self.offset + self.received

    def write(self, data: bytes) -> None:
        self.received += len(data)
        self.store.on_bytes(len(data))
        if self.position > self.size:
            raise InvalidInput(f"upload of {self.sha256[:12]} sent more than the announced {self.size} bytes")
        self._hash.update(data)
        with self._disk("storing"):
            self._file.write(data)

    @contextlib.contextmanager
    def _disk(self, doing: str):
        """Turn a full disk (or a file-size limit) into RESOURCE_EXHAUSTED; other OS errors propagate."""
        try:
            yield
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                raise
            raise ResourceExhausted(
                f"upload of {self.file_name or self.sha256[:12]} ({self.size} bytes) failed: no space left in this "
                f"board's model store while {doing} it ({exc.strerror})",
                hint="free space in hrt_boardd's --model-dir, or give it a larger filesystem") from None

    def _release(self) -> None:
        if self._holds_slot:
            self._holds_slot = False
            self.store._end_upload(self.sha256)

    def commit(self) -> None:
        try:
            self._publish()
        finally:
            self._release()

    def _publish(self) -> None:
        with self._disk("storing"):
            self._file.flush()
            os.fsync(self._file.fileno())  # the bytes are on disk before the name is
            self._file.close()
        if self.position != self.size:
            raise UploadIncomplete(f"upload of {self.sha256[:12]} ended after {self.position} of {self.size} bytes")
        if self._hash.hexdigest() != self.sha256:
            raise InvalidInput(
                f"upload corrupt: content SHA-256 {self._hash.hexdigest()[:12]}... does not match the announced {self.sha256[:12]}..."
            )
        with open(self.tmp_path, "rb") as f:  # refuse non-models, and models that are not only data, before publishing
            check_pieces(decode_bin(f.read(), source=self.file_name or self.sha256[:12]))
        with self._disk("describing"):  # the name first: it only shows once the model does
            write_file_atomic(self.store.meta_path(self.sha256), json.dumps({"file_name": self.file_name}))
        os.replace(self.tmp_path, self.store.path(self.sha256))

    def abort(self, keep: bool = False) -> None:
        """End the upload unpublished. ``keep``: leave what it received for a resumed upload (the caller or its link
        went away); otherwise (wrong bytes, a full disk) the partial file goes."""
        try:
            self._file.close()
        except OSError:
            keep = False  # flushing the rest of a failed upload (a full disk again): the file goes anyway
        finally:
            if not (keep and self.position > 0) and os.path.exists(self.tmp_path):
                os.unlink(self.tmp_path)
            self._release()


def check_pieces(binfile) -> None:
    """A model is data: refuse a .bin any of whose pieces would make onnxruntime read a file of the board."""
    for name, blob in sorted(binfile.blobs.items()):
        check_piece(blob, f"{binfile.source}: piece '{name[:80]}'")


class ModelStore:
    def __init__(self, root: str, max_model_bytes: int = 1 << 30, max_uploads: int = 4,
                 on_bytes: Callable[[int], None] = lambda n: None, max_store_bytes: int = 0,
                 in_use: Callable[[str], bool] = lambda sha: False):
        self.root = os.path.abspath(root)
        self.max_store_bytes = max_store_bytes  # 0: no limit
        self.in_use = in_use  # a model that must stay (loaded now)
        self._reserved = {}  # sha -> announced size, of the uploads in progress
        self.on_bytes = on_bytes  # told of every chunk an upload receives (the daemon's byte count)
        self.max_model_bytes = max_model_bytes
        self.max_uploads = max_uploads
        self._upload_slots = threading.BoundedSemaphore(max_uploads)
        os.makedirs(self.root, exist_ok=True)
        self._lock = threading.Lock()
        self._in_progress = {}  # sha -> Event set when its one running upload ends (published or not)
        self._waiting = 0
        names = set(os.listdir(self.root))
        for name in names:  # temporary files a crash left behind, and metadata whose model never got published
            sha, ext = os.path.splitext(name)
            stray = name.startswith(_PARTIAL_PREFIX) and not _SHA_RE.match(name[len(_PARTIAL_PREFIX):])
            atomic_tmp = name.startswith(".") and name.endswith(".tmp")  # write_file_atomic's
            if stray or atomic_tmp or (ext == ".json" and _SHA_RE.match(sha) and sha + ".bin" not in names):
                os.unlink(os.path.join(self.root, name))
        self._check_partials()

    def path(self, sha: str) -> str:
        return os.path.join(self.root, check_sha(sha) + ".bin")

    def meta_path(self, sha: str) -> str:
        return os.path.join(self.root, check_sha(sha) + ".json")

    def has(self, sha: str) -> bool:
        return os.path.isfile(self.path(sha))

    # -- partial files of uploads (resumable uploads) --
    def partial_path(self, sha: str) -> str:
        return os.path.join(self.root, _PARTIAL_PREFIX + check_sha(sha))

    def partial_bytes(self, sha: str) -> int:
        """Bytes of an unfinished upload of ``sha`` this board holds (0: none): where an upload may resume."""
        try:
            return os.path.getsize(self.partial_path(sha))
        except FileNotFoundError:
            return 0

    def _partials(self) -> List[Tuple[float, str]]:
        """(mtime, sha) of every partial file, oldest first."""
        found = []
        for name in os.listdir(self.root):
            sha = name[len(_PARTIAL_PREFIX):]
            if name.startswith(_PARTIAL_PREFIX) and _SHA_RE.match(sha):
                try:
                    found.append((os.path.getmtime(os.path.join(self.root, name)), sha))
                except FileNotFoundError:
                    pass
        return sorted(found)

    def _check_partials(self) -> None:
        """At start: drop empty partial files, those over the size limit, and the oldest beyond max_uploads."""
        for _, sha in self._partials():
            if not 0 < self.partial_bytes(sha) <= self.max_model_bytes or self.has(sha):
                os.unlink(self.partial_path(sha))
        with self._lock:
            self._make_room_for_partial(None)

    def _make_room_for_partial(self, sha: Optional[str]) -> None:
        """Under self._lock: remove idle partial files, the oldest first, until at most max_uploads exist
        counting one for ``sha`` (an upload starting: None when none is)."""
        partials = self._partials()
        count = len(partials) + (1 if sha is not None and not any(s == sha for _, s in partials) else 0)
        for _, other in partials:
            if count <= self.max_uploads:
                break
            if other != sha and other not in self._in_progress:
                try:
                    os.unlink(self.partial_path(other))
                except FileNotFoundError:
                    pass
                log.info("dropped the unfinished upload of %s to make room", other[:12])
                count -= 1

    def read(self, sha: str) -> bytes:
        try:
            with open(self.path(sha), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise NotFound(f"model {sha[:12]}... is not on this board", hint="upload it first (clients do this for you)") from None

    def begin_upload(self, sha: str, size: int, file_name: str,
                     still_wanted: Callable[[], bool] = lambda: True, offset: int = 0) -> Optional[Upload]:
        """An Upload, or None when the board already has this model.

        While another upload of ``sha`` runs, wait for it (polling ``still_wanted``,
        e.g. "the caller has not gone"): None once it published the model, else
        this caller takes over. ``offset``: resume the unfinished upload there
        (OffsetMismatch when the board holds another length).
        """
        check_sha(sha)
        if size > self.max_model_bytes:
            raise ResourceExhausted(f"model of {size} bytes is over this board's limit of {self.max_model_bytes} bytes")
        if size <= 0:
            raise InvalidModelFile(f"upload of {sha[:12]} announces {size} bytes")
        while True:
            with self._lock:
                if self.has(sha):
                    return None
                running = self._in_progress.get(sha)
                if running is None:
                    self._take_slot(sha)
                    try:
                        self._reserve_room(sha, size)
                    except BaseException:
                        self._end_upload(sha, locked=True)
                        raise
                    self._make_room_for_partial(sha)
                    break
                self._start_waiting(sha)
            log.info("upload of %s waits for the one of the same model in progress", sha[:12])
            try:
                self._wait_for(running, sha, still_wanted)
            finally:
                with self._lock:
                    self._waiting -= 1
        return Upload(self, sha, size, file_name, offset)

    def _take_slot(self, sha: str) -> None:
        """Under self._lock: claim an upload slot for sha, or refuse."""
        if not self._upload_slots.acquire(blocking=False):
            raise ResourceExhausted(f"board is busy: {self.max_uploads} uploads already in progress; upload of {sha[:12]} refused",
                                    hint="retry later, or start hrt_boardd with a larger --max-uploads")
        self._in_progress[sha] = threading.Event()

    def _start_waiting(self, sha: str) -> None:
        """Under self._lock: count one more caller waiting for another upload of sha, or refuse."""
        if self._waiting >= WAITERS_PER_SLOT * self.max_uploads:
            raise ResourceExhausted(f"board is busy: {self._waiting} uploads already waiting for the same models; "
                                    f"upload of {sha[:12]} refused", hint="retry later")
        self._waiting += 1

    @staticmethod
    def _wait_for(running: threading.Event, sha: str, still_wanted: Callable[[], bool]) -> None:
        while not running.wait(_WAIT_POLL_S):
            if not still_wanted():
                raise Cancelled(f"upload of {sha[:12]} cancelled while waiting for another upload of the same model")

    def _end_upload(self, sha: str, locked: bool = False) -> None:
        """An upload of sha ended (published or dropped): free its slot and its room, and wake its waiters."""
        with contextlib.nullcontext() if locked else self._lock:
            self._in_progress.pop(sha).set()
            self._reserved.pop(sha, None)
            self._upload_slots.release()

    # --- the store's quota ---------------------------------------------------------------

    def _reserve_room(self, sha: str, size: int) -> None:
        """Under self._lock: room for an upload of ``size`` bytes within max_store_bytes, made by removing the
        least recently used models not in use; RESOURCE_EXHAUSTED when there is not enough."""
        if not self.max_store_bytes:
            return
        limit = self.max_store_bytes
        over = self.usage()[1] + sum(self._reserved.values()) + self._idle_partial_bytes(sha) + size - limit
        over = self._drop_idle_partials(sha, over)
        for model in self._eviction_order() if over > 0 else ():
            if self.in_use(model.sha256):
                continue
            self.remove(model.sha256)
            log.info("removed model %s (%d bytes, least recently used): the store is over --max-store-mb",
                     model.sha256[:12], model.size)
            over -= model.size
            if over <= 0:
                break
        if over > 0:
            raise ResourceExhausted(
                f"board's model store is full: upload of {sha[:12]} ({size} bytes) would pass its limit of {limit} "
                f"bytes, and the models in it are loaded or being uploaded",
                hint="unload models on the board, or start hrt_boardd with a larger --max-store-mb")
        self._reserved[sha] = size

    def _idle_partial_bytes(self, sha: str) -> int:
        """Under self._lock: the bytes of the partial files of interrupted uploads (not ``sha``'s, not running):
        they count against the quota like models."""
        return sum(self.partial_bytes(other) for _, other in self._partials()
                   if other != sha and other not in self._in_progress)

    def _drop_idle_partials(self, sha: str, over: int) -> int:
        """Under self._lock: remove partial files of interrupted uploads, oldest first, while the store is ``over``
        its quota; returns what is still over."""
        for _, other in self._partials():
            if over <= 0:
                break
            if other == sha or other in self._in_progress:
                continue
            held = self.partial_bytes(other)
            try:
                os.unlink(self.partial_path(other))
            except FileNotFoundError:
                continue
            log.info("dropped the unfinished upload of %s (%d bytes): the store is over --max-store-mb", other[:12], held)
            over -= held
        return over

    def _eviction_order(self) -> List[StoredModel]:
        """The stored models, least recently used (loaded or stored) first."""
        def used(model: StoredModel) -> float:
            try:
                return os.stat(self.path(model.sha256)).st_atime
            except OSError:
                return 0.0

        return sorted(self.list(), key=used)

    def touch(self, sha: str) -> None:
        """Mark a model as just used (its .bin's access time; the file itself is never rewritten): the last the
        quota removes."""
        try:
            stat = os.stat(self.path(sha))
            os.utime(self.path(sha), ns=(time.time_ns(), stat.st_mtime_ns))
        except OSError:
            pass

    def remove(self, sha: str) -> None:
        """Remove a model from the store (the .bin first: without it, the .json is never listed)."""
        for path in (self.path(sha), self.meta_path(sha)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def uploads_in_progress(self) -> Tuple[int, int]:
        """(uploads receiving bytes, uploads waiting for another upload of their model) now."""
        with self._lock:
            return len(self._in_progress), self._waiting

    def usage(self) -> Tuple[int, int]:
        """(models stored, their bytes)."""
        count = size = 0
        with os.scandir(self.root) as entries:
            for entry in entries:
                sha, ext = os.path.splitext(entry.name)
                if ext == ".bin" and _SHA_RE.match(sha):
                    try:
                        size += entry.stat().st_size
                        count += 1
                    except FileNotFoundError:
                        pass  # removed since listed
        return count, size

    def list(self) -> List[StoredModel]:
        out = []
        for name in sorted(os.listdir(self.root)):
            sha, ext = os.path.splitext(name)
            if ext != ".bin" or not _SHA_RE.match(sha):
                continue
            file_name = ""
            try:
                with open(self.meta_path(sha)) as f:
                    file_name = display_file_name(json.load(f).get("file_name", ""))
            except (OSError, ValueError, AttributeError):
                pass  # metadata is informational: a model without it is still listed
            out.append(StoredModel(sha, os.path.getsize(os.path.join(self.root, name)), file_name))
        return out
