"""A small TCP proxy for fault tests: a slow, stalling or dropping network on loopback.

    proxy = FaultProxy({9473: ("127.0.0.1", 9473), 40001: ("127.0.0.1", 40001)}).start()
    target = f"{proxy.host}:9473"      # 127.0.0.2: the same port numbers, another loopback address
    proxy.delay_s = 0.2                # every forwarded chunk waits this long
    proxy.up_rate = 2000               # client -> daemon trickles at 2000 bytes/s (down_rate: the other way)
    proxy.stall()                      # keep the connections open, forward nothing
    proxy.reset_all()                  # drop every connection with a TCP RST
    proxy.reset_after_bytes = 4096     # drop a connection once the client has sent this much
    proxy.stop()

It listens on another loopback address (127.0.0.2) with the same port numbers as
the daemon, so a board that advertises its data channel port (BoardInfo.data_port)
is reached through the proxy for both gRPC and the data channel. Loopback only,
one pump thread per direction per connection, at most ``max_connections``; every
thread ends when ``stop`` closes the sockets.
"""
import socket
import struct
import threading
import time
from typing import Dict, List, Optional, Tuple

PROXY_HOST = "127.0.0.2"
CHUNK = 16 << 10


def _rst_close(sock: socket.socket) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a crashed peer or a dropping middlebox does."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # Wake a pump thread blocked in recv: the kernel frees the socket (and sends the
        # RST) only once no syscall holds it, and close() alone does not end a recv.
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Link:
    """One proxied connection: client socket <-> upstream socket."""

    def __init__(self, proxy: "FaultProxy", client: socket.socket, upstream: socket.socket):
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.sent_up = 0
        self.closed = threading.Event()

    def start(self) -> None:
        for src, dst, up in ((self.client, self.upstream, True), (self.upstream, self.client, False)):
            threading.Thread(target=self._pump, args=(src, dst, up), daemon=True, name="fault-proxy-pump").start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        p = self.proxy
        try:
            while not self.closed.is_set():
                data = src.recv(CHUNK)
                if not data:
                    break
                while p.stalled.is_set() and not self.closed.is_set():
                    time.sleep(0.02)  # hold the bytes: a network that stopped moving them
                if p.delay_s:
                    time.sleep(p.delay_s)
                if upstream and p.reset_after_bytes is not None and self.sent_up + len(data) > p.reset_after_bytes:
                    keep = max(0, p.reset_after_bytes - self.sent_up)
                    if keep:
                        dst.sendall(data[:keep])
                    self.reset()
                    return
                rate = p.up_rate if upstream else p.down_rate
                if rate:
                    piece = max(1, rate // 20)  # trickle: a piece every 50 ms
                    for i in range(0, len(data), piece):
                        dst.sendall(data[i:i + piece])
                        time.sleep(0.05)
                else:
                    dst.sendall(data)
                if upstream:
                    self.sent_up += len(data)
        except OSError:
            pass
        self.close()

    def reset(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            _rst_close(self.client)
            _rst_close(self.upstream)

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            for s in (self.client, self.upstream):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


class FaultProxy:
    """Forwards ``PROXY_HOST:port`` to ``routes[port]``; the faults are switched on and off at run time."""

    def __init__(self, routes: Dict[int, Tuple[str, int]], host: str = PROXY_HOST, max_connections: int = 64):
        self.host = host
        self.routes = dict(routes)
        self.max_connections = max_connections
        self.delay_s = 0.0
        self.up_rate = 0    # bytes/s client -> daemon (0: as fast as it goes)
        self.down_rate = 0  # bytes/s daemon -> client
        self.reset_after_bytes: Optional[int] = None
        self.stalled = threading.Event()
        self.links: List[_Link] = []
        self.accepted = 0
        self._listeners: List[socket.socket] = []
        self._acceptors: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def start(self) -> "FaultProxy":
        for port, upstream in self.routes.items():
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((self.host, port))
            s.listen(16)
            s.settimeout(0.2)
            self._listeners.append(s)
            t = threading.Thread(target=self._accept, args=(s, upstream), daemon=True, name="fault-proxy-accept")
            t.start()
            self._acceptors.append(t)
        return self

    def _accept(self, listener: socket.socket, upstream: Tuple[str, int]) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                self.links = [link for link in self.links if not link.closed.is_set()]
                if len(self.links) >= self.max_connections:
                    _rst_close(client)
                    continue
            try:
                up = socket.create_connection(upstream, timeout=5)
                up.settimeout(None)
            except OSError:
                _rst_close(client)
                continue
            client.settimeout(None)
            link = _Link(self, client, up)
            with self._lock:
                self.links.append(link)
                self.accepted += 1
            link.start()

    def stall(self) -> None:
        self.stalled.set()

    def unstall(self) -> None:
        self.stalled.clear()

    def reset_all(self) -> None:
        with self._lock:
            links, self.links = self.links, []
        for link in links:
            link.reset()

    def stop(self) -> None:
        self._stopping.set()
        self.stalled.clear()
        for t in self._acceptors:  # each sees _stopping within its accept timeout
            t.join(timeout=5)
        for s in self._listeners:
            s.close()  # only now: a socket closed under a blocked accept() stays bound until it returns
        self.reset_all()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
