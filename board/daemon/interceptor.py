"""Server interceptors: error translation (once, for every method) and token auth.

A BpuEmuError raised anywhere below a servicer method becomes the gRPC status
its class names, with its message (and hint) as details. Anything else is a
bug: it is logged with its traceback and reported as INTERNAL with a short
message that says so, and the daemon keeps serving.
"""
import hmac
import logging
import time

import grpc

from bpuemu.common.errors import BpuEmuError
from bpuemu.common.wire import TOKEN_METADATA_KEY

log = logging.getLogger("bpuemu.board.daemon")


def _abort(context, exc: BaseException, method: str):
    if isinstance(exc, BpuEmuError):
        log.info("%s: %s: %s", method, exc.grpc_status, exc.message)
        context.abort(getattr(grpc.StatusCode, exc.grpc_status), str(exc))
    log.exception("%s failed unexpectedly", method)
    context.abort(
        grpc.StatusCode.INTERNAL,
        f"internal error in {method}: {type(exc).__name__}: {exc} (a bpuemu bug; the daemon log has the traceback)",
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


class ErrorInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method.rsplit("/", 1)[-1]
        return _rewrap(continuation(handler_call_details), _wrap_unary, _wrap_stream, method)


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuse calls without the board's token (health checks stay open for probes)."""

    OPEN_PREFIXES = ("/grpc.health.v1.Health/",)

    def __init__(self, token: str):
        self._token = ("Bearer " + token).encode()

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(self.OPEN_PREFIXES):
            return continuation(handler_call_details)
        sent = dict(handler_call_details.invocation_metadata or ()).get(TOKEN_METADATA_KEY, "")
        if hmac.compare_digest(sent.encode(), self._token):
            return continuation(handler_call_details)
        reason = "no token" if not sent else "wrong token"
        handler = continuation(handler_call_details)

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{reason}: this board requires its token (pass --token-file)")

        def deny_stream(request, context):
            deny(request, context)
            yield  # pragma: no cover

        return _rewrap(handler, lambda b, m: deny, lambda b, m: deny_stream, handler_call_details.method)


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
