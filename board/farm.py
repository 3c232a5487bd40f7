"""A board farm: several independent hrt_boardd daemons driven from one host.

    boards = parse_boards("10.0.0.1:9473,10.0.0.2:9473")   # or "@boards.txt"
    with FarmClient(boards, ["m.bin"]) as farm:            # upload + load on every board, in parallel
        run = farm.perf("", PerfConfig(frame_count=200))   # the same job on every board at once
        run.summary.fps                                    # FPS summed over the boards
        farm.model("").infer([x])                          # one infer, spread by gRPC round_robin
        for i, out in farm.map(lambda h, x: h.infer([x]).outputs, xs):  # items over the boards,
            ...                                            # a lost board's items redone on the others

``FarmClient`` is a Backend (bpuemu.board.backends): ``model_info``, ``infer``
and ``perf`` fan out to every board (one thread and one client per board) and
return each board's outcome plus the aggregate, exactly as for one board; a
board that fails (unreachable, restarted mid-job, refused) is that board's
outcome and the other boards' results are kept. A board that cannot be opened
(reached, given the model) is a failed outcome in every call.

Infer load: ``model(name)`` is a handle on one gRPC channel over all the
boards that opened, with the ``round_robin`` load-balancing policy
(bpuemu.board.client), so gRPC itself spreads consecutive calls over the
boards and skips a board that is down. The data channel is a plain connection
to one board, which gRPC cannot balance; that handle uses gRPC Infer only (the
per-board backends use their data channels for everything else).

Many items: ``map`` (``map_with_failover``) gives each board a worker that
takes the next item; a board that is lost (unreachable, gone mid-call, past
its deadline) stops taking items and its item in flight goes back to the
others, so a board dying mid-run costs only that item's time.

Over TLS the round-robin channel checks every board's certificate against one
name (gRPC has one authority per channel): ``--tls-server-name``, else the
first board's host. Give the farm's boards certificates that carry a shared
name (for example the Kubernetes headless Service's), or address them by IPs
that all their certificates list.

A board list file holds one HOST:PORT per line; ``#`` starts a comment.
"""
import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar

from bpuemu.common.errors import BoardUnavailable, DeadlineExceeded, InvalidInput, read_text_file
from bpuemu.common.proto import board_pb2
from bpuemu.common.wire import join_target, split_target
from bpuemu.board.backends import Backend, BoardOutcome, BoardRun, ModelHandle, RemoteBackend, RemoteModel, fan_out
from bpuemu.board.client import BoardClient, Deadlines
from bpuemu.board.security import TlsConfig

B = TypeVar("B")
T = TypeVar("T")
R = TypeVar("R")


def _board_list_file(path: str) -> List[str]:
    entries = []
    for line in read_text_file(path, "board list").splitlines():
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


# --- every board of the farm, as one backend ------------------------------------------------

class FarmClient(Backend):
    """Every board of a farm: a backend per board (opened in parallel), one round-robin channel for infer."""

    def __init__(self, targets: Sequence[str], model_files: Sequence[str], access: Optional[BoardAccess] = None):
        super().__init__()
        if not targets:
            raise InvalidInput("a farm needs at least one board")
        self.access = access or BoardAccess()
        self.balanced: Optional[BoardClient] = None
        self._boards: List[BoardOutcome[RemoteBackend]] = fan_out(
            list(targets), lambda t: self.access.backend(t, model_files))
        try:
            self._balance()
        except BaseException:
            self.close()
            raise
        self.description = f"board farm ({len(self._boards)} boards)"
        self.address = ",".join(o.target for o in self._boards)

    def _balance(self) -> None:
        """The round-robin handles: every model, on the boards that opened."""
        opened = [o.value for o in self._boards if o.ok]
        if not opened:
            return
        self.balanced = self.access.client(",".join(be.client.target for be in opened), data_channel=False)
        for name in opened[0].model_names:
            h = opened[0].models[name]
            self._add(RemoteModel(self.balanced, h.sha, h.model))

    def boards(self) -> List[BoardOutcome[RemoteBackend]]:
        return list(self._boards)

    @property
    def targets(self) -> List[str]:
        return [o.target for o in self._boards]

    @property
    def load_ms(self) -> float:
        """The slowest board's upload and load."""
        return max((o.value.load_ms for o in self._boards if o.ok), default=0.0)

    def model(self, name: Optional[str] = None) -> ModelHandle:
        """The model called ``name``, its infer spread by gRPC round_robin over the boards that opened."""
        if self.balanced is None:
            BoardRun("opening the farm", self._boards).raise_if_failed()
        return super().model(name)

    def board_models(self, name: Optional[str] = None) -> Dict[str, ModelHandle]:
        """Board -> that board's own handle on the model, for every board that opened (none: why each failed)."""
        if self.balanced is None:
            BoardRun("opening the farm", self._boards).raise_if_failed()
        return {o.target: o.value.model(name) for o in self._boards if o.ok}

    def map(self, work: Callable[[ModelHandle, T], R], items: Iterable[T], model_name: Optional[str] = None
            ) -> Iterator[Tuple[int, R]]:
        """``work(handle, item)`` for every item, spread over the boards with failover (``map_with_failover``)."""
        return map_with_failover(self.board_models(model_name), work, items)

    def stats(self) -> Dict[str, board_pb2.BoardStats]:
        """Each opened board's counters (GetStats)."""
        return {o.target: o.value.client.stats() for o in self._boards if o.ok}

    def close(self) -> None:
        for o in getattr(self, "_boards", []):
            if o.ok:
                o.value.close()
        if self.balanced is not None:
            self.balanced.close()


# --- many items over the boards, with failover ---------------------------------------------

#: Errors that mean the board is lost (not that the item is bad): its item in flight goes to another board.
BOARD_LOST = (BoardUnavailable, DeadlineExceeded)


def map_with_failover(boards: Mapping[str, B], work: Callable[[B, T], R], items: Iterable[T],
                      lost: Tuple[type, ...] = BOARD_LOST) -> Iterator[Tuple[int, R]]:
    """Yield ``(index, work(board, item))`` for every item, in the order they finish.

    Each board gets one worker thread that takes the next item. A board whose
    call raises one of ``lost`` takes no more items, and its item in flight is
    put back for the boards left, so a board dying mid-run costs only that
    item's time. Another error stops the run and is raised here. When every
    board is lost with items left, BoardUnavailable names each board and why.
    Leaving the loop early (break, an exception) stops the workers after the
    items they are running.
    """
    pending = deque(enumerate(items))
    total = len(pending)
    lock = threading.Condition()
    done: "queue.Queue" = queue.Queue()
    state = {"in_flight": 0, "stop": False}
    alive = set(boards)
    why: Dict[str, str] = {}

    def worker(name: str, board: B) -> None:
        while True:
            with lock:
                while not pending and state["in_flight"] and not state["stop"]:
                    lock.wait()  # an item in flight elsewhere may come back
                if state["stop"] or not pending:
                    return
                index, item = pending.popleft()
                state["in_flight"] += 1
            try:
                result = work(board, item)
            except lost as exc:
                with lock:
                    pending.appendleft((index, item))
                    state["in_flight"] -= 1
                    alive.discard(name)
                    why[name] = exc.message.splitlines()[0]
                    lock.notify_all()
                done.put(("lost", name, exc))
                return
            except BaseException as exc:  # noqa: B902 -- the item's own failure ends the run, raised by the caller
                with lock:
                    state["in_flight"] -= 1
                    lock.notify_all()
                done.put(("error", index, exc))
                return
            with lock:
                state["in_flight"] -= 1
                lock.notify_all()
            done.put(("ok", index, result))

    if total and not boards:
        raise InvalidInput("no board to run the items on")
    threads = [threading.Thread(target=worker, args=(n, b), name=f"map-{n}", daemon=True) for n, b in boards.items()]
    for t in threads:
        t.start()
    try:
        finished = 0
        while finished < total:
            kind, key, value = done.get()
            if kind == "ok":
                finished += 1
                yield key, value
            elif kind == "error":
                raise value
            else:
                with lock:
                    if not alive:
                        raise BoardUnavailable(f"every board was lost with {total - finished} of {total} items left: "
                                               + "; ".join(f"{n}: {w}" if n not in w else w for n, w in why.items()))
    finally:
        with lock:
            state["stop"] = True
            lock.notify_all()
        for t in threads:
            t.join()
