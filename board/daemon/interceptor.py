"""Server interceptors: error translation (once, for every method), token auth, request limits.

A BpuEmuError raised anywhere below a servicer method becomes the gRPC status
its class names, with its message (and hint) as details. Anything else is a
bug: it is logged with its traceback and reported as INTERNAL with a short
message that says so, and the daemon keeps serving. What goes back to a caller
never holds the board's absolute paths (``without_paths``).

Authenticate before parsing: a call without the board's token is refused by a
handler that reads no request message (a request-streaming one that never
iterates), so an unauthenticated request costs the daemon its metadata and no
more; the refusal is logged with the peer (``AuthFailures``) and counted in
the metrics.

Requests of the calls that pass are read by the ErrorInterceptor itself (each
method served as request-streaming): the request must come within
``request_deadline_s`` (a caller that never sends it holds a worker thread no
longer), one peer (an IP address; every loopback address counts as one) may
have at most ``stalled_per_peer`` calls whose request is over ``STALL_S`` late
(the newest of more are ended with RESOURCE_EXHAUSTED), and a request is parsed
only when its parse takes at most a bounded multiple of its size
(bpuemu.common.wire.parse_bounded). Health watches, which gRPC serves
without a worker thread (``experimental_non_blocking``), pass untouched.
"""
import functools
import hmac
import ipaddress
import logging
import threading
import time
from typing import Optional

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from bpuemu.common.errors import BpuEmuError, InvalidInput, without_paths
from bpuemu.common.wire import TOKEN_METADATA_KEY, MessageTooLarge, parse_bounded

log = logging.getLogger("bpuemu.board.daemon")

#: Seconds between two log lines about failed authentications (the ones in between are counted in the next).
AUTH_LOG_EVERY_S = 1.0


class AuthFailures:
    """Failed authentications, on every transport: counted in the metrics and logged with the peer, at most one
    line per AUTH_LOG_EVERY_S (a flood of refusals does not fill the log)."""

    def __init__(self, metrics=None):
        self.metrics = metrics
        self._lock = threading.Lock()
        self._last = -AUTH_LOG_EVERY_S
        self._unlogged = 0

    def refused(self, transport: str, peer: str, what: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.auth_failure(transport)
        with self._lock:
            now = time.monotonic()
            if now - self._last < AUTH_LOG_EVERY_S:
                self._unlogged += 1
                return
            self._last, unlogged, self._unlogged = now, self._unlogged, 0
        log.warning("authentication failed: %s from %s (%s, %s)%s", what[:80], peer[:80], transport, reason,
                    f"; {unlogged} more refused since the last such line" if unlogged else "")


def _abort(context, exc: BaseException, method: str):
    if isinstance(exc, BpuEmuError):
        log.info("%s: %s: %s", method, exc.grpc_status, exc.message)
        context.abort(getattr(grpc.StatusCode, exc.grpc_status), without_paths(str(exc)))
    log.exception("%s failed unexpectedly", method)
    context.abort(
        grpc.StatusCode.INTERNAL,
        without_paths(f"internal error in {method}: {type(exc).__name__}: {exc} "
                      "(a bpuemu bug; the daemon log has the traceback)"),
    )


def _wrap_unary(behavior, method):
    def wrapped(request, context):
        try:
            return behavior(request, context)
        except grpc.RpcError:
            raise
        except Exception as exc:  # translated exactly once, here
            _abort(context, exc, method)

    return wrapped


def _wrap_stream(behavior, method):
    def wrapped(request, context):
        try:
            yield from behavior(request, context)
        except grpc.RpcError:
            raise
        except Exception as exc:
            _abort(context, exc, method)

    return wrapped


def _rewrap(handler, wrap_unary, wrap_stream, method):
    if handler is None:
        return None
    if _non_blocking(handler):  # a health watch: served without a worker thread, nothing to translate
        return handler
    kw = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(wrap_unary(handler.unary_unary, method), **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(wrap_unary(handler.stream_unary, method), **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(wrap_stream(handler.unary_stream, method), **kw)
    if handler.stream_stream:
        return grpc.stream_stream_rpc_method_handler(wrap_stream(handler.stream_stream, method), **kw)
    return handler


def _non_blocking(handler) -> bool:
    behavior = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    return bool(getattr(behavior, "experimental_non_blocking", False))


#: Seconds after which a call still waiting for its request counts as stalled (against its peer's share).
STALL_S = 0.5


def peer_host(peer: str) -> str:
    """The host of a gRPC peer ("ipv4:10.0.0.2:5000" -> "10.0.0.2"); every loopback address is "loopback"."""
    kind, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0].strip("[]") if kind in ("ipv4", "ipv6") else peer
    try:
        return "loopback" if ipaddress.ip_address(host).is_loopback else host
    except ValueError:
        return host


def _end_call(context, code: grpc.StatusCode, message: str) -> None:
    """End a call from outside its thread: the caller gets ``code`` and ``message``."""
    log.info("%s", message)
    context.set_code(code)  # what the metrics count
    try:  # the status and message the caller sees (gRPC's core call; context.cancel() would say CANCELLED)
        context._rpc_event.call.cancel(code.value[0], message)
    except (AttributeError, TypeError):
        context.cancel()


class _Waits:
    """Calls waiting for their request: ended past their deadline, and beyond their peer's share of stalled
    ones. One thread for all of them, started with the first."""

    TICK_S = 0.25

    def __init__(self, stalled_per_peer: int):
        self.stalled_per_peer = stalled_per_peer
        self._lock = threading.Lock()
        self._calls = {}  # key -> (since, deadline, context, message)
        self._next = 0
        self._thread: Optional[threading.Thread] = None

    def watch(self, context, seconds: float, message: str) -> int:
        now = time.monotonic()
        with self._lock:
            self._next += 1
            self._calls[self._next] = (now, now + seconds, context, message)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hrt_boardd-waits", daemon=True)
                self._thread.start()
            return self._next

    def done(self, key: int) -> None:
        with self._lock:
            self._calls.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.TICK_S)
            for context, code, message in self._due(time.monotonic()):
                _end_call(context, code, message)

    def _due(self, now: float) -> list:
        """(context, status, message) of the calls to end now, taken off the watch."""
        due, stalled = [], {}
        with self._lock:
            for key, (since, deadline, context, message) in sorted(self._calls.items()):
                if deadline <= now:
                    due.append((key, context, grpc.StatusCode.DEADLINE_EXCEEDED, message))
                elif since + STALL_S <= now:
                    stalled.setdefault(peer_host(context.peer()), []).append((key, context))
            for peer, calls in stalled.items():
                for key, context in calls[self.stalled_per_peer:]:  # the newest beyond the share
                    due.append((key, context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"board is busy: {len(calls)} calls from {peer} wait for their request; "
                                f"at most {self.stalled_per_peer} may"))
            for key, *_ in due:
                del self._calls[key]
        return [d[1:] for d in due]


@functools.lru_cache(maxsize=None)
def _request_class(method: str):
    """The request message class of a method path ("/pkg.Service/Method"), or None when the pool lacks it."""
    try:
        found = descriptor_pool.Default().FindMethodByName(method.lstrip("/").replace("/", "."))
    except KeyError:
        return None
    return message_factory.GetMessageClass(found.input_type)


class ErrorInterceptor(grpc.ServerInterceptor):
    """Translate errors (see the module docstring), and read each unary request within ``request_deadline_s``,
    parsed with a bound on what the parse may take."""

    def __init__(self, request_deadline_s: float = 60.0, stalled_per_peer: int = 16):
        self.request_deadline_s = request_deadline_s
        self._expiry = _Waits(stalled_per_peer)

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method.rsplit("/", 1)[-1]
        handler = continuation(handler_call_details)
        if handler is not None and not handler.request_streaming and not _non_blocking(handler):
            handler = self._read_request_here(handler, handler_call_details.method, method)
        return _rewrap(handler, _wrap_unary, _wrap_stream, method)

    def _read_request_here(self, handler, path: str, method: str):
        """The unary-request ``handler`` served as request-streaming: its one request read by the call's code,
        within the deadline and the parse bound."""
        cls = _request_class(path)
        deserialize = handler.request_deserializer
        if cls is not None:
            def deserialize(data, cls=cls):
                try:
                    return parse_bounded(cls, data)
                except (MessageTooLarge, DecodeError) as exc:
                    return exc  # raised in the call, where it becomes INVALID_ARGUMENT
        behavior = handler.unary_unary or handler.unary_stream
        expiry, seconds = self._expiry, self.request_deadline_s

        def one_request(request_iterator, context):
            key = expiry.watch(context, seconds, f"{method}: no request within {seconds:.0f} s (hrt_boardd "
                                                 f"--call-deadline); call ended")
            try:
                request = next(request_iterator, None)
            finally:
                expiry.done(key)
            if isinstance(request, MessageTooLarge):
                raise InvalidInput(f"{method} request refused: {request}; its size does not allow that")
            if isinstance(request, DecodeError):
                raise InvalidInput(f"{method} request refused: not a valid {cls.DESCRIPTOR.name} ({request})")
            if request is None:
                raise InvalidInput(f"{method} call sent no request message")
            return request

        kw = dict(request_deserializer=deserialize, response_serializer=handler.response_serializer)
        if handler.unary_unary:
            return grpc.stream_unary_rpc_method_handler(lambda it, ctx: behavior(one_request(it, ctx), ctx), **kw)

        def streamed(request_iterator, context):
            return behavior(one_request(request_iterator, context), context)

        return grpc.stream_stream_rpc_method_handler(streamed, **kw)


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuse calls without the board's token (health checks stay open for probes)."""

    OPEN_PREFIXES = ("/grpc.health.v1.Health/",)

    def __init__(self, token: str, failures: Optional[AuthFailures] = None):
        self._token = ("Bearer " + token).encode()
        self._failures = failures or AuthFailures()

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(self.OPEN_PREFIXES):
            return continuation(handler_call_details)
        sent = dict(handler_call_details.invocation_metadata or ()).get(TOKEN_METADATA_KEY, "")
        if hmac.compare_digest(sent.encode(), self._token):
            return continuation(handler_call_details)
        reason = "no token" if not sent else "wrong token"
        method, failures = handler_call_details.method, self._failures

        def deny(request_iterator, context):  # never iterated: the request is neither read nor parsed
            failures.refused("grpc", context.peer(), method, reason)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{reason}: this board requires its token (pass --token-file)")

        return grpc.stream_unary_rpc_method_handler(deny, request_deserializer=_unparsed)


def _unparsed(data: bytes) -> None:
    """The request deserializer of a refused call: nothing is parsed (nor, as it is never asked for, read)."""
    return None


class MetricsInterceptor(grpc.ServerInterceptor):
    """Count every call of a known method, with its status code and latency (``hrt_boardd --metrics-listen``).

    The outermost interceptor: it sees the status the others set (UNAUTHENTICATED,
    a translated BpuEmuError); a call whose caller went away (cancelled, or its
    deadline passed) before it ended is CANCELLED.
    """

    def __init__(self, metrics):
        self._metrics = metrics

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method.rsplit("/", 1)[-1]
        return _rewrap(continuation(handler_call_details), self._unary, self._stream, method)

    def _record(self, method: str, context, started: float, failed: bool) -> None:
        code = context.code()
        if code is not None:
            name = code.name
        elif not context.is_active():  # the caller cancelled, or its deadline passed
            name = "CANCELLED"
        else:
            name = "UNKNOWN" if failed else "OK"
        self._metrics.call(method, "grpc", name, time.perf_counter() - started)

    def _unary(self, behavior, method):
        def wrapped(request, context):
            started, failed = time.perf_counter(), True
            try:
                reply = behavior(request, context)
                failed = False
                return reply
            finally:
                self._record(method, context, started, failed)

        return wrapped

    def _stream(self, behavior, method):
        def wrapped(request, context):
            started, failed = time.perf_counter(), True
            try:
                yield from behavior(request, context)
                failed = False
            finally:
                self._record(method, context, started, failed)

        return wrapped
