#!/usr/bin/env python3
"""Boards on a real network on this machine: each hrt_boardd in its own Linux network namespace,
reached from the root namespace only through an emulated link with latency, jitter, loss, a
bandwidth limit and outages.

    sudo python bench/netlab.py --boards lan,wifi,bad --seconds 600
    # prints one line per board: "board 1 (wifi): 198.18.4.2:9473 token-file /tmp/.../token"
    # then e.g.:  BPUEMU_TOKEN=$(cat TOKEN_FILE) hrt_model_exec perf --model_file m.bin --board 198.18.4.2:9473
    # Ctrl-C (or --seconds) tears everything down.

How a link is made (there is no ``tc netem`` here: it needs the kernel's sch_netem, which not every
kernel has, so nothing below uses it):

* Board i lives in the namespace ``bpuemu-net-<pid>-<i>``. Its link is a pair of TUN devices (layer 3,
  point to point): one in the root namespace with address ``198.18.X.1``, one moved into the board's
  namespace with ``198.18.X.2`` (X chosen free in 198.18.0.0/15, the range set aside for network
  benchmarks). The root namespace routes ``198.18.X.0/30`` into its device; the board's default route
  is its device. Nothing else is addressed or reached.
* A relay process (``bench/netlab.py relay``, one per link) holds both devices' file descriptors and
  moves every IP packet across, one queue per direction, as netem's delay/loss/rate model does:

  - loss: each packet is dropped with probability ``loss`` (independent, a seeded generator);
  - bandwidth: a packet leaves the queue only after the previous one has been serialized at
    ``rate_bps`` (``len * 8 / rate`` seconds each);
  - latency and jitter: it is then delivered ``delay`` + uniform(-``jitter``, +``jitter``) seconds after
    it left, never before the packet ahead of it (order is kept, like netem with a rate);
  - queue: at most ``QUEUE_PACKETS`` wait per direction; more are dropped at the tail;
  - outage: ``down SECONDS`` on the relay's stdin (``Lab.down``) drops every packet, both ways, for
    that long: silence, no error and no reset reaches either end, as when a Wi-Fi link drops.

  The relay is plain Python reading and writing packets: it adds its own per-packet cost (tens of
  microseconds) and on a loaded machine its own scheduling delay, which the benches measure as part
  of the link.

Profiles (``PROFILES``): ``lan`` 0.2 ms one way, no loss, 1 Gbit/s; ``wifi`` 5 ms +- 2 ms, 0.5 % loss,
50 Mbit/s; ``bad`` 40 ms +- 10 ms, 2 % loss, 10 Mbit/s. The delay is applied in each direction, so a
round trip takes twice it.

Teardown: ``Lab`` is a context manager; on leaving it (also after an exception) the daemons get
SIGTERM (then SIGKILL), the relays are stopped (their TUN devices vanish with their file descriptors)
and the namespaces are deleted. Daemons and relays die with the process that made them
(PR_SET_PDEATHSIG), and a new Lab first removes what a killed one left (namespaces named after a
process that no longer runs). ``leftovers()`` lists what would remain: the tests check it is empty.

Needs root (CAP_NET_ADMIN), ``ip`` (iproute2) and /dev/net/tun; ``unavailable()`` says in one line
why a lab cannot be made here, or returns None.
"""
import argparse
import ctypes
import dataclasses
import fcntl
import heapq
import os
import random
import re
import secrets
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Dict, List, Optional, Sequence

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
NS_PREFIX = "bpuemu-net-"
DEV_PREFIX = "bpn"  # TUN device names: bpn<lab><i>r (root side), bpn<lab><i>b (board side); <= 15 chars
BOARD_PORT = 9473
QUEUE_PACKETS = 1000
MTU = 1500
#: Seconds any one setup or teardown command may take.
COMMAND_TIMEOUT_S = 20.0
#: Seconds a daemon may take to start serving.
START_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class LinkProfile:
    """What a link does to each packet, each way (see the module docstring)."""

    name: str
    delay_s: float
    jitter_s: float = 0.0
    loss: float = 0.0
    rate_bps: float = 1e9

    @property
    def rtt_s(self) -> float:
        return 2 * self.delay_s

    def transfer_s(self, nbytes: int) -> float:
        """Seconds to serialize ``nbytes`` at the link's rate."""
        return nbytes * 8 / self.rate_bps


PROFILES: Dict[str, LinkProfile] = {
    p.name: p for p in (
        LinkProfile("lan", delay_s=0.0002, rate_bps=1e9),
        LinkProfile("wifi", delay_s=0.005, jitter_s=0.002, loss=0.005, rate_bps=50e6),
        LinkProfile("bad", delay_s=0.040, jitter_s=0.010, loss=0.02, rate_bps=10e6),
    )
}


# --- the relay: one link, run as its own process ------------------------------------------

_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000


def open_tun(name: str) -> int:
    """A new (non-persistent) TUN device ``name``; it goes when the returned descriptor closes."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Direction:
    """Packets one way across a link: loss, serialization at the rate, delay and jitter, in order."""

    def __init__(self, profile: LinkProfile, rng: random.Random, out_fd: int):
        self.p, self.rng, self.out_fd = profile, rng, out_fd
        self.queue: deque = deque()  # (deliver_at, packet)
        self.wire_free_at = 0.0  # when the previous packet has been serialized
        self.last_delivery = 0.0
        self.dropped = 0

    def arrive(self, packet: bytes, now: float, down: bool) -> None:
        if down or len(self.queue) >= QUEUE_PACKETS or (self.p.loss and self.rng.random() < self.p.loss):
            self.dropped += 1
            return
        left = max(now, self.wire_free_at) + len(packet) * 8 / self.p.rate_bps
        self.wire_free_at = left
        jitter = self.rng.uniform(-self.p.jitter_s, self.p.jitter_s) if self.p.jitter_s else 0.0
        deliver = max(left + max(0.0, self.p.delay_s + jitter), self.last_delivery)
        self.last_delivery = deliver
        self.queue.append((deliver, packet))

    def deliver_due(self, now: float, down: bool) -> Optional[float]:
        """Write what is due; the time the next packet is due (None: nothing waits)."""
        while self.queue and self.queue[0][0] <= now:
            _, packet = self.queue.popleft()
            if down:
                self.dropped += 1
                continue
            try:
                os.write(self.out_fd, packet)
            except OSError:  # the device's own queue is full, or it is going away: the packet is lost
                self.dropped += 1
        return self.queue[0][0] if self.queue else None


def run_relay(root_dev: str, board_dev: str, profile: LinkProfile, seed: int, ready_file: str,
              max_seconds: float) -> None:
    """Move packets between the two TUN devices until stdin closes or ``max_seconds`` pass.

    Reads commands from stdin: ``down SECONDS`` (drop everything both ways for that long).
    """
    fds = {"root": open_tun(root_dev), "board": open_tun(board_dev)}
    rng = random.Random(seed)
    to_board = _Direction(profile, rng, fds["board"])
    to_root = _Direction(profile, rng, fds["root"])
    route = {fds["root"]: to_board, fds["board"]: to_root}
    with open(ready_file, "w") as f:
        f.write("ready\n")
    stdin = sys.stdin.fileno()
    os.set_blocking(stdin, False)
    down_until = 0.0
    end = time.monotonic() + max_seconds
    pending = b""
    while True:
        now = time.monotonic()
        if now > end:
            return
        down = now < down_until
        waits = [t for t in (to_board.deliver_due(now, down), to_root.deliver_due(now, down)) if t is not None]
        timeout = max(0.0, min(waits) - now) if waits else 0.5
        if down:
            timeout = min(timeout, max(0.0, down_until - now))
        readable, _, _ = select.select([fds["root"], fds["board"], stdin], [], [], min(timeout, 0.5))
        now = time.monotonic()
        down = now < down_until
        for fd in readable:
            if fd == stdin:
                data = os.read(stdin, 4096)
                if not data:
                    return  # the lab went away
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    words = line.split()
                    if len(words) == 2 and words[0] == b"down":
                        down_until = time.monotonic() + float(words[1])
                        down = True
                continue
            direction = route[fd]
            for _ in range(256):  # a bounded batch per wakeup: the other direction gets its turn
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                direction.arrive(packet, now, down)


# --- the lab: namespaces, links, daemons ---------------------------------------------------

def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=check)


def _die_with_parent() -> None:
    """In a child before exec: SIGKILL it when the process that started it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    os.setpgrp()  # not in the terminal's group: Ctrl-C reaches the lab, which stops it in order


def unavailable() -> Optional[str]:
    """One line saying why a lab cannot be made here; None when it can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); run as root"
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (no TUN devices)"
    probe = f"{NS_PREFIX}probe-{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip() or 'ip netns add failed'}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _namespaces() -> List[str]:
    out = _run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _devices() -> List[str]:
    out = _run("ip", "-o", "link", "show", check=False).stdout
    return [m.group(1) for m in re.finditer(r"^\d+: ([^:@]+)", out, re.M)]


def leftovers() -> List[str]:
    """Namespaces, devices and qdiscs of labs that are still there (in the root namespace)."""
    found = [f"namespace {n}" for n in _namespaces() if n.startswith(NS_PREFIX)]
    found += [f"device {d}" for d in _devices() if d.startswith(DEV_PREFIX)]
    qdiscs = _run("tc", "qdisc", "show", check=False).stdout if shutil.which("tc") else ""
    found += [f"qdisc {line.strip()}" for line in qdiscs.splitlines() if f" dev {DEV_PREFIX}" in line]
    return found


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> List[str]:
    """Delete the namespaces of labs whose process no longer runs; returns their names."""
    removed = []
    for ns in _namespaces():
        m = re.match(re.escape(NS_PREFIX) + r"(\d+)-", ns)
        if m and not _pid_alive(int(m.group(1))):
            _kill_namespace_processes(ns)
            _run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    return removed


def _kill_namespace_processes(ns: str) -> None:
    out = _run("ip", "netns", "pids", ns, check=False).stdout
    for pid in out.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _used_subnets() -> set:
    out = _run("ip", "-o", "-4", "addr", "show", check=False).stdout
    return {(int(a), int(b)) for a, b in re.findall(r"inet 198\.(1[89])\.(\d+)\.\d+", out)}


@dataclasses.dataclass
class Board:
    """One namespaced board: its link and its daemon."""

    index: int
    profile: LinkProfile
    namespace: str
    address: str
    root_address: str
    root_dev: str
    board_dev: str
    workdir: str
    relay: Optional[subprocess.Popen] = None
    daemon: Optional[subprocess.Popen] = None
    port: int = BOARD_PORT

    @property
    def target(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def log_path(self) -> str:
        return os.path.join(self.workdir, "hrt_boardd.log")

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""


class Lab:
    """N boards, each behind its own emulated link (see the module docstring). A context manager.

    ``profiles``: one profile name per board. ``daemon_args``: extra hrt_boardd arguments.
    ``max_seconds``: the relays stop by themselves after this long, whatever happens.
    """

    def __init__(self, profiles: Sequence[str], workdir: Optional[str] = None, daemon_args: Sequence[str] = (),
                 python: str = sys.executable, max_seconds: float = 1800.0, seed: int = 1):
        unknown = [p for p in profiles if p not in PROFILES]
        if unknown:
            raise ValueError(f"unknown link profile(s) {unknown}; known: {sorted(PROFILES)}")
        self.profile_names = list(profiles)
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="bpuemu-netlab-")
        os.makedirs(self.workdir, exist_ok=True)
        self.daemon_args = list(daemon_args)
        self.python = python
        self.max_seconds = max_seconds
        self.seed = seed
        self.token = secrets.token_hex(16)
        self.token_file = os.path.join(self.workdir, "token")
        self.lab_id = f"{os.getpid() % 100000:05d}"[-3:] + secrets.token_hex(1)
        self.boards: List[Board] = []

    # -- lifecycle --
    def __enter__(self) -> "Lab":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Lab":
        remove_stale()
        with open(self.token_file, "w") as f:
            f.write(self.token + "\n")
        os.chmod(self.token_file, 0o600)
        used = _used_subnets()
        free = [x for x in range(4, 250) if (18, x) not in used]
        if len(free) < len(self.profile_names):
            raise RuntimeError("no free /24 left in 198.18.0.0/24..198.18.249.0/24")
        for i, name in enumerate(self.profile_names):
            self.boards.append(self._make_board(i, PROFILES[name], free[i]))
        for board in self.boards:
            self._start_daemon(board)
        for board in self.boards:
            self._wait_serving(board)
        return self

    def _make_board(self, i: int, profile: LinkProfile, octet: int) -> Board:
        ns = f"{NS_PREFIX}{os.getpid()}-{i}"
        board = Board(index=i, profile=profile, namespace=ns, address=f"198.18.{octet}.2",
                      root_address=f"198.18.{octet}.1", root_dev=f"{DEV_PREFIX}{self.lab_id}{i}r",
                      board_dev=f"{DEV_PREFIX}{self.lab_id}{i}b", workdir=os.path.join(self.workdir, f"board{i}"))
        os.makedirs(board.workdir, exist_ok=True)
        self.boards_pending = board  # torn down by stop() even if this fails half way
        _run("ip", "netns", "add", ns)
        ready = os.path.join(board.workdir, "relay.ready")
        p = profile
        board.relay = subprocess.Popen(
            [self.python, os.path.abspath(__file__), "relay", board.root_dev, board.board_dev,
             f"{p.delay_s}", f"{p.jitter_s}", f"{p.loss}", f"{p.rate_bps}", str(self.seed + i), ready,
             str(self.max_seconds)],
            stdin=subprocess.PIPE, preexec_fn=_die_with_parent)
        self._wait_for(lambda: os.path.exists(ready) or board.relay.poll() is not None, 10.0, "the link relay to start")
        if board.relay.poll() is not None:
            raise RuntimeError(f"the link relay of board {i} exited with {board.relay.returncode}")
        _run("ip", "link", "set", board.board_dev, "netns", ns)
        _run("ip", "addr", "add", f"{board.root_address}/30", "dev", board.root_dev)
        _run("ip", "link", "set", board.root_dev, "mtu", str(MTU), "up")
        inside = ("ip", "netns", "exec", ns)
        _run(*inside, "ip", "link", "set", "lo", "up")
        _run(*inside, "ip", "addr", "add", f"{board.address}/30", "dev", board.board_dev)
        _run(*inside, "ip", "link", "set", board.board_dev, "mtu", str(MTU), "up")
        _run(*inside, "ip", "route", "add", "default", "dev", board.board_dev)
        return board

    def _start_daemon(self, board: Board) -> None:
        port_file = os.path.join(board.workdir, "port")
        args = ["ip", "netns", "exec", board.namespace, self.python, "-m", "bpuemu.board.daemon",
                "--listen", f"{board.address}:{BOARD_PORT}", "--model-dir", os.path.join(board.workdir, "models"),
                "--port-file", port_file, "--token-file", self.token_file, *self.daemon_args]
        env = {k: v for k, v in os.environ.items() if k not in ("BPUEMU_TOKEN",) and not k.startswith("BPUEMU_TLS_")}
        with open(board.log_path, "ab") as log:
            board.daemon = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=board.workdir, env=env,
                                            preexec_fn=_die_with_parent)

    def _wait_serving(self, board: Board) -> None:
        port_file = os.path.join(board.workdir, "port")
        self._wait_for(lambda: os.path.exists(port_file) or board.daemon.poll() is not None, START_TIMEOUT_S,
                       f"board {board.index} to serve")
        if board.daemon.poll() is not None:
            raise RuntimeError(f"hrt_boardd of board {board.index} exited with {board.daemon.returncode}:\n{board.log()}")

    @staticmethod
    def _wait_for(ready, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {seconds:.0f} s waiting for {what}")
            time.sleep(0.02)

    def down(self, board: Board, seconds: float) -> None:
        """Drop every packet of ``board``'s link, both ways, for ``seconds`` (returns at once)."""
        board.relay.stdin.write(f"down {seconds}\n".encode())
        board.relay.stdin.flush()

    def stop(self) -> None:
        """Stop the daemons, the relays and delete the namespaces; safe to call twice."""
        boards = list(self.boards)
        pending = getattr(self, "boards_pending", None)
        if pending is not None and pending not in boards:
            boards.append(pending)
        for board in boards:
            if board.daemon is not None and board.daemon.poll() is None:
                board.daemon.send_signal(signal.SIGTERM)
        for board in boards:
            _end(board.daemon, 15.0)
            if board.relay is not None:
                try:
                    board.relay.stdin.close()
                except OSError:
                    pass
                _end(board.relay, 5.0)
            if board.namespace in _namespaces():
                _kill_namespace_processes(board.namespace)
                _run("ip", "netns", "del", board.namespace, check=False)
        self.boards = []
        self.boards_pending = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _end(proc: Optional[subprocess.Popen], seconds: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5.0)


# --- models to move across the links -------------------------------------------------------

def padded_model(src: str, dst: str, total_bytes: int, seed: int = 0) -> str:
    """Write ``dst``: the `.bin` ``src`` with an unused initializer of random bytes added to its largest blob (an
    ONNX model), so the file is about ``total_bytes`` long, still loads and runs as ``src`` does, and does not
    compress. Returns its SHA-256."""
    import numpy as np
    import onnx  # host-only: the benches and tests run on the host

    from bpuemu.common.container import read_bin, write_bin

    binfile = read_bin(src)
    name = max(binfile.blobs, key=lambda n: len(binfile.blobs[n]))
    graph = onnx.ModelProto()
    graph.ParseFromString(binfile.blobs[name])
    pad = max(0, total_bytes - os.path.getsize(src) - 64)
    data = np.random.default_rng(seed).integers(0, 256, pad, dtype=np.uint8)
    graph.graph.initializer.append(onnx.numpy_helper.from_array(data, name="netlab_padding"))
    blobs = dict(binfile.blobs)
    blobs[name] = graph.SerializeToString()
    return write_bin(dst, binfile.manifest.models, blobs, packed=binfile.manifest.packed)


# --- command line ---------------------------------------------------------------------------

def _relay_main(argv: List[str]) -> None:
    root_dev, board_dev, delay, jitter, loss, rate, seed, ready, max_seconds = argv
    profile = LinkProfile("relay", float(delay), float(jitter), float(loss), float(rate))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_relay(root_dev, board_dev, profile, int(seed), ready, float(max_seconds))


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["relay"]:
        _relay_main(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boards", default="lan,wifi,bad", help="link profiles, one per board (lan, wifi, bad)")
    parser.add_argument("--seconds", type=float, default=600.0, help="tear down after this long (at most)")
    parser.add_argument("--workdir", help="keep the boards' stores and logs here")
    args = parser.parse_args(argv)
    why = unavailable()
    if why:
        print(f"netlab: {why}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with Lab(args.boards.split(","), workdir=args.workdir, max_seconds=args.seconds + 60) as lab:
        for b in lab.boards:
            p = b.profile
            print(f"board {b.index} ({p.name}: {p.delay_s * 1e3:g} ms +- {p.jitter_s * 1e3:g} ms, {p.loss:.1%} loss, "
                  f"{p.rate_bps / 1e6:g} Mbit/s): {b.target}  token-file {lab.token_file}", flush=True)
        try:
            time.sleep(args.seconds)
        except KeyboardInterrupt:
            pass
    print("netlab: torn down", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
