"""Server interceptor: per-RPC context for logs, one log line and metrics per call.

Reads the caller's metadata `x-run-id`, `x-step` and `x-request-id` into
structlog contextvars (as run_id, step, request_id, plus `method`), so every
log line emitted while handling the call, including on the worker thread,
carries them. After the call it logs one line (method, code, ms) and, when
given an RpcMetrics, counts the call and records its latency. Health checks
are logged at debug level only (clients poll them).
"""

from __future__ import annotations

import asyncio
import time

import grpc
import structlog

from tandem.logging import get_logger
from tandem.metrics import RpcMetrics

_log = get_logger("tandem.rpc")
_KEYS = {"x-run-id": "run_id", "x-step": "step", "x-request-id": "request_id"}
_HEALTH = "/grpc.health.v1.Health/"


def _code_name(code) -> str:
    if isinstance(code, grpc.StatusCode):
        return code.name
    for c in grpc.StatusCode:  # grpc.aio may report the raw integer
        if c.value[0] == code:
            return c.name
    return str(code)


class ContextInterceptor(grpc.aio.ServerInterceptor):
    """Binds request metadata into contextvars; logs and measures each unary call."""

    def __init__(self, metrics: RpcMetrics | None = None):
        self._metrics = metrics

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler  # unknown method or streaming: leave as is
        method = handler_call_details.method  # "/tandem.v1.RewardService/Score"
        short = method.rsplit("/", 2)[-2].rsplit(".", 1)[-1] + "." + method.rsplit("/", 1)[-1]
        ctx_vars = {"method": short}
        for k, v in handler_call_details.invocation_metadata or ():
            if k in _KEYS:
                ctx_vars[_KEYS[k]] = v
        behavior, metrics = handler.unary_unary, self._metrics
        quiet = method.startswith(_HEALTH)

        async def wrapped(request, context):
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(**ctx_vars)
            t0 = time.perf_counter()
            code = "OK"
            try:
                response = await behavior(request, context)
                if context.code() is not None:
                    code = _code_name(context.code())
                return response
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except BaseException:
                code = _code_name(context.code()) if context.code() is not None else "UNKNOWN"
                raise
            finally:
                dt = time.perf_counter() - t0
                if metrics is not None and not quiet:
                    metrics.observe(short, code, dt)
                (_log.debug if quiet else _log.info)("rpc", code=code, ms=round(dt * 1e3, 3))

        return grpc.unary_unary_rpc_method_handler(
            wrapped, request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)
