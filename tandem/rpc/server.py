"""Build and run a Tandem gRPC server (grpc.aio, on uvloop via `run_server`).

`serve` registers servicers from the proto service descriptors (not from the
generated *_pb2_grpc helpers), so every method gets the same wrapper:

- a request that does not parse answers INVALID_ARGUMENT
  "request could not be parsed as tandem.v1.XRequest: ..." (grpc's default
  would be a bare INTERNAL/UNKNOWN);
- TandemError -> its status code and message; any other exception, BaseException
  included (only cancellation passes) -> INTERNAL "ExcType: first line of the message"
  with the traceback logged. The process keeps serving either way;
- a method the servicer lacks answers UNIMPLEMENTED;
- server-streaming methods are async generators with the same mapping (an error after some
  messages ends the stream with its status); a handler may yield bytes it serialized itself
  (a large message built without protobuf's copies, tandem/weights/wire.py).

Operability (STYLE 9.2 habit 9): explicit max message sizes, grpc.health.v1
(NOT_SERVING until servicers and `on_ready` are done, NOT_SERVING again on
SIGTERM/SIGINT, then a graceful stop; the same when the process that started it, named by
TANDEM_PARENT_PID, is gone), the port written to `port_file`
atomically once SERVING (removed at stop), per-RPC logs, optional
Prometheus metrics via `tandem.rpc.interceptors` (`metrics_port`, on 127.0.0.1 only), and gRPC
server reflection (grpcurl can list and describe every service). TLS and bearer tokens
come from `security` (tandem/rpc/security.py, auth.py, tls.py). Servicer methods are
`async def M(self, request, context)`; model work belongs on a
`WorkerThread`, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any, Awaitable, Callable

import grpc
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tandem.logging import get_logger
from tandem.metrics import RpcMetrics, start_metrics_server
from tandem.rpc.errors import TandemError
from tandem.rpc.interceptors import ContextInterceptor
from tandem.rpc.security import PLAINTEXT, EndpointSecurity
from tandem.v1 import (  # noqa: F401  (fill the descriptor pool)
    actor_pb2,
    controller_pb2,
    critic_pb2,
    lifecycle_pb2,
    reward_pb2,
    rollout_pb2,
)

_log = get_logger("tandem.rpc.server")

# set by a launcher whose services belong to it (`tandem run`'s): the service stops when that
# process is gone, even killed with SIGKILL, instead of running on with nobody to stop it
PARENT_PID_ENV = "TANDEM_PARENT_PID"


class _Unparsed:
    """Stands in for a request whose bytes did not parse."""

    def __init__(self, error: Exception):
        self.error = error


def _lenient(cls) -> Callable[[bytes], Any]:
    def deserialize(data: bytes):
        try:
            return cls.FromString(data)
        except Exception as e:  # noqa: BLE001 - any parse failure becomes INVALID_ARGUMENT
            return _Unparsed(e)
    return deserialize


async def _refuse_unservable(request, context, fn, name: str, input_full_name: str) -> None:
    if isinstance(request, _Unparsed):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"request could not be parsed as {input_full_name}: {request.error}")
    if fn is None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not implemented by this server")


@contextlib.asynccontextmanager
async def _errors_as_status(context, name: str):
    """TandemError -> its status; any other exception, BaseException included (torch's
    CheckpointException is one, and grpc.aio would leave the call unanswered until its deadline),
    -> INTERNAL (logged); the service lives on. Only cancellation passes through."""
    try:
        yield
    except TandemError as e:
        await context.abort(e.code, str(e))
    except (grpc.aio.AbortError, asyncio.CancelledError, GeneratorExit):
        raise  # the servicer aborted itself, the call was cancelled, or its stream was closed
    except BaseException as e:  # noqa: BLE001 - a bug must not kill the service or hang its caller
        _log.exception("rpc.internal_error", rpc=name)
        await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {_first_line(e)}")


def _first_line(error: BaseException) -> str:
    """A status message is one line; the whole text is in the log (torch's errors carry tracebacks)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def _wrap(fn, service: str, method, input_full_name: str):
    name = f"{service}.{method}"

    async def handler(request, context):
        await _refuse_unservable(request, context, fn, name, input_full_name)
        async with _errors_as_status(context, name):
            return await fn(request, context)

    return handler


def _wrap_stream(fn, service: str, method, input_full_name: str):
    """`_wrap` for a server-streaming method (an async generator)."""
    name = f"{service}.{method}"

    async def handler(request, context):
        await _refuse_unservable(request, context, fn, name, input_full_name)
        async with _errors_as_status(context, name):
            async for message in fn(request, context):
                yield message

    return handler


def _serialize(message) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def _generic_handler(service_full_name: str, servicer: Any) -> grpc.GenericRpcHandler:
    try:
        desc = descriptor_pool.Default().FindServiceByName(service_full_name)
    except KeyError:
        raise ValueError(f"unknown gRPC service '{service_full_name}' (import its *_pb2 module first)") from None
    handlers = {}
    for m in desc.methods:
        if m.client_streaming:
            raise ValueError(f"{service_full_name}.{m.name}: client-streaming RPCs are not supported")
        req_cls = message_factory.GetMessageClass(m.input_type)
        fn = getattr(servicer, m.name, None)
        if fn is None:
            _log.warning("rpc.unimplemented", service=service_full_name, method=m.name)
        wrap, kind = ((_wrap_stream, grpc.unary_stream_rpc_method_handler) if m.server_streaming
                      else (_wrap, grpc.unary_unary_rpc_method_handler))
        handlers[m.name] = kind(wrap(fn, desc.name, m.name, m.input_type.full_name),
                                request_deserializer=_lenient(req_cls), response_serializer=_serialize)
    return grpc.method_handlers_generic_handler(service_full_name, handlers)


def _write_port_file(path: str, port: int) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, path)


async def serve(servicers: list[tuple[str, Any]], *, role: str, host: str = "127.0.0.1", port: int = 0,
                port_file: str | None = None, max_message_mb: int = 512, grace_s: float = 5.0,
                on_ready: Callable[[], Awaitable[Any]] | None = None,
                metrics_port: int | None = None, security: EndpointSecurity = PLAINTEXT,
                health_servicer: health.aio.HealthServicer | None = None,
                held: Callable[[str], bool] = lambda name: False) -> None:
    """Serve `servicers` ([(full service name, servicer)]) until SIGTERM/SIGINT or cancellation;
    TLS and a bearer token on the port per `security` (tandem/rpc/security.py).

    health_servicer: pass one to change health statuses later (a long-lived service: its role's
    service is SERVING only while it holds a run); names for which `held(name)` is true stay
    NOT_SERVING when the server is ready."""
    parent = _parent_pid()
    max_bytes = max_message_mb * 1024 * 1024
    metrics = RpcMetrics(role)
    server = grpc.aio.server(
        interceptors=[ContextInterceptor(metrics), *security.server_interceptors()],
        options=[("grpc.max_send_message_length", max_bytes),
                 ("grpc.max_receive_message_length", max_bytes),
                 ("grpc.so_reuseport", 0)])
    health_servicer = health_servicer or health.aio.HealthServicer()
    names = [""] + [name for name, _ in servicers]
    for name in names:  # the aio servicer starts "" as SERVING; we are not yet
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_generic_rpc_handlers([_generic_handler(name, obj) for name, obj in servicers])
    # reflection (grpcurl list/describe): the services, health, reflection itself, from the proto pool
    reflection.enable_server_reflection([*names[1:], health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    bound = security.add_port(server, f"{host}:{port}")
    if bound == 0:
        raise OSError(f"{role}: could not bind {host}:{port}")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (e.g. tests): rely on cancellation

    watch = None if parent is None else asyncio.ensure_future(_watch_parent(parent, stop))
    httpd = start_metrics_server(metrics_port, metrics.registry) if metrics_port is not None else None
    await server.start()
    try:
        if on_ready is not None:
            await on_ready()
        for name in names:
            if not held(name):
                await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        if port_file:
            _write_port_file(port_file, bound)
        _log.info("server.serving", host=host, port=bound, services=names[1:], **security.describe,
                  metrics_port=httpd.server_port if httpd else None)
        await stop.wait()
        _log.info("server.stopping", reason="parent gone" if watch is not None and watch.done() else "signal", grace_s=grace_s)
    finally:
        if watch is not None:
            watch.cancel()
        await health_servicer.enter_graceful_shutdown()  # NOT_SERVING for every name
        await server.stop(grace_s)
        for sig in installed:
            loop.remove_signal_handler(sig)
        if httpd is not None:
            httpd.shutdown()
        if port_file:
            with contextlib.suppress(FileNotFoundError):
                os.remove(port_file)  # a stale port file would point clients at nothing
        _log.info("server.stopped")


def _parent_pid() -> int | None:
    """The process whose end stops this server (PARENT_PID_ENV), or None."""
    value = os.environ.get(PARENT_PID_ENV, "")
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{PARENT_PID_ENV}={value!r} is not a process id") from None


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    """Set `stop` once this process's parent is no longer `parent` (it died: the process was handed
    to init or a subreaper), then return (a done watch: the reason for the stop)."""
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    _log.warning("server.parent_gone", parent=parent)
    stop.set()


def run_server(coro: Awaitable[Any]) -> Any:
    """Run `coro` (usually `serve(...)`) to completion on uvloop when installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is in requirements.txt
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)
