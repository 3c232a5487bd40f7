"""Prometheus metrics of one hrt_boardd (``hrt_boardd --metrics-listen HOST:PORT``, off by default).

``GET /metrics`` answers in the Prometheus text format (prometheus_client):

- ``hrt_boardd_calls_total{method,transport,code}``: calls answered, by method
  (the proto's: Infer, Perf, UploadModel, ...; Check for health probes),
  transport (``grpc``, or ``data`` for the infer data channel) and status code
  (OK, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ...);
  ``hrt_boardd_call_errors_total{...}``: those that did not end OK;
  ``hrt_boardd_call_duration_seconds{method,transport}``: their latency (histogram).
- ``hrt_boardd_auth_failures_total{transport}``: calls and connections refused for a
  missing or wrong token (grpc, data, metrics), each also logged with its peer.
- ``hrt_boardd_frames_total{kind}``: frames run by infer and perf calls.
- ``hrt_boardd_jobs_running{kind}``, ``hrt_boardd_jobs_queued{kind}`` (loading their
  model, which takes a job slot too; the board refuses rather than queues
  calls beyond --max-jobs: ``hrt_boardd_jobs_refused_busy_total``), ``hrt_boardd_job_slots``.
- ``hrt_boardd_uploads_in_flight``, ``hrt_boardd_uploads_waiting`` (for another upload
  of the same model), ``hrt_boardd_upload_bytes_received_total``, ``hrt_boardd_uploads_total``.
- ``hrt_boardd_models_loaded``, ``hrt_boardd_loaded_model_bytes{sha256}``,
  ``hrt_boardd_store_models``, ``hrt_boardd_store_bytes``.
- ``process_resident_memory_bytes``, ``process_open_fds`` (and the other
  ``process_*`` of prometheus_client), ``hrt_boardd_threads``.
- ``hrt_boardd_info{version,api_version}`` (always 1).

Everything that describes the board's state is read when scraped, so no label
set grows with the calls made: the labels are bounded by the service's methods,
the status codes, and the models loaded now.

Security is the daemon's: beyond loopback a token is required (``Authorization:
Bearer <token>``, the daemon's --token-file; Prometheus: ``authorization:
{credentials_file: ...}``), and with --tls-cert/--tls-key the endpoint is HTTPS
(with --tls-ca, clients must present a certificate: Prometheus ``tls_config``).
Each scrape must be over within ``SCRAPE_DEADLINE_S`` (whole request, reply
included). A connection takes one of ``MAX_CONNECTIONS`` serving slots only
once its request carried the token: until then it holds one of
``PENDING_CONNECTIONS`` (more are closed at once), so idle sockets cannot take
the slots scrapes need. A refused token is logged with the peer and counted
(``hrt_boardd_auth_failures_total{transport="metrics"}``).
"""
import hmac
import logging
import socket
import socketserver
import ssl
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from bpuemu.common.errors import InvalidInput, PermissionDenied
from bpuemu.common.version import API_VERSION, __version__
from bpuemu.common.wire import is_loopback_host, join_target, split_target
from bpuemu.board.daemon.interceptor import AuthFailures
from bpuemu.board.daemon.state import BoardState

log = logging.getLogger("bpuemu.board.daemon")

#: Seconds one scrape may take, from accepting its connection to the last byte of the reply.
SCRAPE_DEADLINE_S = 10.0
#: Scrapes served at once, once authenticated; one more gets 503.
MAX_CONNECTIONS = 8
#: Connections open before their request is read and authenticated; one more is closed at once.
PENDING_CONNECTIONS = 64
#: Latency buckets (seconds): a 1 ms infer to a 10-minute perf job.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 300.0, 600.0)


def process_threads() -> int:
    """Threads of this process (the kernel's count: onnxruntime's and gRPC's too), 0 where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class Metrics:
    """The daemon's metrics registry: call counters fed by the servers, the rest read from the state."""

    def __init__(self, state: BoardState):
        self.registry = CollectorRegistry()
        labels = ("method", "transport", "code")
        self._calls = Counter("hrt_boardd_calls", "Calls answered, by method, transport and status code",
                              labels, registry=self.registry)
        self._errors = Counter("hrt_boardd_call_errors", "Calls that ended with a status other than OK",
                               labels, registry=self.registry)
        self._latency = Histogram("hrt_boardd_call_duration_seconds", "Time from a call's start to its last reply",
                                  ("method", "transport"), buckets=LATENCY_BUCKETS, registry=self.registry)
        self._auth_failures = Counter("hrt_boardd_auth_failures", "Connections and calls refused for a missing or "
                                      "wrong token, by transport", ("transport",), registry=self.registry)
        ProcessCollector(registry=self.registry)
        self.registry.register(_StateCollector(state))

    def auth_failure(self, transport: str) -> None:
        """Count one refusal for a missing or wrong token (transport: grpc, data, metrics)."""
        self._auth_failures.labels(transport).inc()

    def call(self, method: str, transport: str, code: str, seconds: float) -> None:
        """Count one call that ended with ``code`` (a gRPC status name) after ``seconds``."""
        self._calls.labels(method, transport, code).inc()
        if code != "OK":
            self._errors.labels(method, transport, code).inc()
        self._latency.labels(method, transport).observe(seconds)


class _StateCollector:
    """Figures read from the board's state at each scrape."""

    def __init__(self, state: BoardState):
        self.state = state

    def collect(self):
        state = self.state
        counts = state.stats.snapshot()
        info = GaugeMetricFamily("hrt_boardd_info", "This daemon's version", labels=("version", "api_version"))
        info.add_metric((__version__, str(API_VERSION)), 1)
        yield info
        frames = CounterMetricFamily("hrt_boardd_frames", "Frames run, by infer calls and by perf jobs", labels=("kind",))
        frames.add_metric(("infer",), counts["infer_frames"])
        frames.add_metric(("perf",), counts["perf_frames"])
        yield frames
        yield CounterMetricFamily("hrt_boardd_perf_jobs", "Perf jobs started", value=counts["perf_jobs"])
        yield CounterMetricFamily("hrt_boardd_jobs_refused_busy", "Infer and perf calls refused: every job slot was taken",
                                  value=counts["refused_busy"])
        running, queued = state.jobs_by_kind()
        for name, help_text, values in (
                ("hrt_boardd_jobs_running", "Infer and perf calls running in a job slot", running),
                ("hrt_boardd_jobs_queued", "Infer and perf calls loading their model (in a job slot of their own)",
                 queued)):
            family = GaugeMetricFamily(name, help_text, labels=("kind",))
            for kind in ("infer", "perf"):
                family.add_metric((kind,), values.get(kind, 0))
            yield family
        yield GaugeMetricFamily("hrt_boardd_job_slots", "Job slots (--max-jobs)", value=state.limits.max_jobs)
        store = state.store
        in_flight, waiting = store.uploads_in_progress()
        yield GaugeMetricFamily("hrt_boardd_uploads_in_flight", "Model uploads receiving bytes now", value=in_flight)
        yield GaugeMetricFamily("hrt_boardd_uploads_waiting", "Uploads waiting for another upload of the same model",
                                value=waiting)
        yield CounterMetricFamily("hrt_boardd_upload_bytes_received", "Bytes received by model uploads",
                                  value=counts["upload_bytes"])
        yield CounterMetricFamily("hrt_boardd_uploads", "Models stored by upload", value=counts["uploads"])
        loaded = state.loaded_sizes()
        yield GaugeMetricFamily("hrt_boardd_models_loaded", "Models loaded (sessions ready to run)", value=len(loaded))
        sizes = GaugeMetricFamily("hrt_boardd_loaded_model_bytes", "Size of each loaded model's .bin", labels=("sha256",))
        for sha, size in sorted(loaded.items()):
            sizes.add_metric((sha,), size)
        yield sizes
        models, size = store.usage()
        yield GaugeMetricFamily("hrt_boardd_store_models", "Models in the store (--model-dir)", value=models)
        yield GaugeMetricFamily("hrt_boardd_store_bytes", "Bytes of the models in the store", value=size)
        yield GaugeMetricFamily("hrt_boardd_threads", "Threads of the daemon process", value=process_threads())


class _Handler(BaseHTTPRequestHandler):
    server: "MetricsServer"
    protocol_version = "HTTP/1.0"  # one request per connection: each scrape's deadline is its connection's

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path not in ("/metrics", "/"):
            self._reply(404, b"not found: scrape /metrics\n")
            return
        token = self.server.token
        if token is not None:
            sent = self.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(sent, b"Bearer " + token):
                self.server.failures.refused("metrics", self.client_address[0], "GET /metrics",
                                             "wrong token" if sent else "no token")
                self._reply(401, b"this board's metrics require its token (Authorization: Bearer ...)\n",
                            {"WWW-Authenticate": "Bearer"})
                return
        if not self.server.serving.acquire(blocking=False):
            self._reply(503, b"board is busy: %d scrapes in progress\n" % MAX_CONNECTIONS)
            return
        try:
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._reply(200, encoder(self.server.metrics.registry), {"Content-Type": content_type})
        finally:
            self.server.serving.release()

    def _reply(self, status: int, body: bytes, headers: Optional[dict] = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # scrapes are not worth a log line each
        log.debug("metrics %s: " + format, self.client_address[0], *args)


class MetricsServer(socketserver.ThreadingMixIn, HTTPServer):
    """The /metrics endpoint, on a thread of its own; ``stop`` ends it."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, listen: str, metrics: Metrics, token: Optional[str] = None,
                 ssl_context: Optional[ssl.SSLContext] = None, deadline_s: float = SCRAPE_DEADLINE_S,
                 failures=None):
        try:
            host, port = split_target(listen, default_port=0)
        except ValueError as exc:
            raise InvalidInput(f"--metrics-listen {listen}: {exc}") from None
        if not is_loopback_host(host) and not token:
            raise PermissionDenied(
                f"refusing to serve metrics on {host}, beyond loopback, without authentication",
                hint="give --token-file FILE (scrapers send it as 'Authorization: Bearer'), or use "
                     "--metrics-listen 127.0.0.1:PORT")
        if not is_loopback_host(host) and ssl_context is None:
            log.warning("serving metrics on %s beyond loopback without TLS: the token crosses the network in clear; "
                        "give --tls-cert/--tls-key", host)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            super().__init__((host, port), _Handler)
        except OSError as exc:
            raise InvalidInput(f"cannot serve metrics on {join_target(host, port)}: {exc.strerror}",
                               hint="is another process using that port? pick another with --metrics-listen") from None
        self.metrics = metrics
        self.token = token.encode() if token else None
        self.ssl_context = ssl_context
        self.deadline_s = deadline_s
        self.host = host
        self.failures = failures or AuthFailures(metrics)
        self._connections = threading.BoundedSemaphore(PENDING_CONNECTIONS)  # open, not yet authenticated
        self.serving = threading.BoundedSemaphore(MAX_CONNECTIONS)  # authenticated, being answered
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def target(self) -> str:
        return join_target(self.host, self.port)

    def process_request(self, request, client_address):
        if not self._connections.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connections.release()

    def finish_request(self, request, client_address):
        # The whole scrape (TLS handshake, request, reply) within its deadline, however slowly the peer
        # sends or reads: past it the socket is shut down, which ends any read or write under way.
        timer = threading.Timer(self.deadline_s, _shut, (request,))
        timer.daemon = True
        timer.start()
        conn = request
        try:
            request.settimeout(self.deadline_s)
            if self.ssl_context is not None:
                conn = self.ssl_context.wrap_socket(request, server_side=True)  # takes over the descriptor
            self.RequestHandlerClass(conn, client_address, self)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError: a failed handshake, a cut connection
            log.debug("metrics connection from %s closed: %s", client_address[0], exc)
        finally:
            timer.cancel()
            if conn is not request:
                conn.close()

    def handle_error(self, request, client_address):
        log.debug("metrics request from %s failed", client_address[0], exc_info=True)

    def start(self) -> "MetricsServer":
        self._thread = threading.Thread(target=self.serve_forever, name="hrt_boardd-metrics", daemon=True)
        self._thread.start()
        scheme = "https" if self.ssl_context is not None else "http"
        log.info("metrics on %s://%s/metrics (%s)", scheme, self.target, "token" if self.token else "no token")
        return self

    def stop(self) -> None:
        # shutdown() waits for serve_forever to notice: it would wait forever if start() never ran.
        if getattr(self, "_thread", None) is not None:
            self.shutdown()
            self._thread.join(timeout=10)
        self.server_close()


def _shut(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
