"""Async gRPC client base: channel options, deadlines, metadata, error mapping.

`ServiceClient` wraps one generated stub. Every call has a deadline, carries
the client's metadata (x-run-id, x-step, ...) plus a fresh x-request-id
(and the endpoint's bearer token, over TLS when configured: tandem/rpc/security.py),
and turns a failed call into the matching `TandemError` subclass with the
message "<Service>.<Method>: <details>". No retries here: the controller
decides what is safe to repeat (an update is not). It can re-point a client at a
restarted service (`repoint`) and, for a service without state, give it a
`resend_after_failure` hook: a failed call is sent again when the hook says the
service is back. With `deadlines` (tandem/rpc/deadlines.py) a call's deadline is measured
from the service's earlier calls instead of the configured `timeout_s`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.rpc.deadlines import CallDeadlines
from tandem.rpc.errors import TandemError, Unavailable, error_from_rpc
from tandem.rpc.security import PLAINTEXT, EndpointSecurity


def make_channel(endpoint: str, max_message_mb: int = 512,
                 security: EndpointSecurity = PLAINTEXT) -> grpc.aio.Channel:
    """A grpc.aio channel with deliberate message-size limits; TLS and a bearer token per `security`."""
    max_bytes = max_message_mb * 1024 * 1024
    return security.channel(endpoint, [
        ("grpc.max_send_message_length", max_bytes),
        ("grpc.max_receive_message_length", max_bytes),
    ])


def _md_key(key: str) -> str:
    """step -> x-step, run_id -> x-run-id; keys already starting with x- kept."""
    key = key.lower().replace("_", "-")
    return key if key.startswith("x-") else f"x-{key}"


class ServiceClient:
    """One endpoint, one stub; `await client.call("Score", request)`."""

    def __init__(self, endpoint: str, stub_cls: type, *, timeout_s: float = 600,
                 metadata: dict | None = None, max_message_mb: int = 512,
                 security: EndpointSecurity = PLAINTEXT):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.service = stub_cls.__name__.removesuffix("Stub")
        self._metadata: dict[str, str] = {}
        self.set_metadata(**(metadata or {}))
        self._stub_cls, self._max_message_mb, self._security = stub_cls, max_message_mb, security
        self._channel = make_channel(endpoint, max_message_mb, security)
        self.stub = stub_cls(self._channel)
        # (error, endpoint it came from) -> True when the service is back and the call may be sent again
        self.resend_after_failure: Callable[[TandemError, str], Awaitable[bool]] | None = None
        self.deadlines: CallDeadlines | None = None  # None: every call gets timeout_s


    async def repoint(self, endpoint: str) -> None:
        """Talk to `endpoint` from now on (the service was restarted there)."""
        old, self.endpoint = self._channel, endpoint
        self._channel = make_channel(endpoint, self._max_message_mb, self._security)
        self.stub = self._stub_cls(self._channel)
        await old.close()
        if self.deadlines is not None:
            self.deadlines.process_restarted()

    @property
    def channel(self) -> grpc.aio.Channel:
        return self._channel

    def set_metadata(self, **kv: Any) -> None:
        """Set metadata sent with every call (e.g. step=3, run_id="r1"); None removes."""
        for k, v in kv.items():
            if v is None:
                self._metadata.pop(_md_key(k), None)
            else:
                self._metadata[_md_key(k)] = str(v)

    async def call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        """Call `method` with a deadline (`timeout_s` if given, else the measured one or the
        client's timeout_s); raise the TandemError for a failed call."""
        fn = getattr(self.stub, method, None)
        if fn is None:
            raise AttributeError(f"{self.service} has no method '{method}'")
        name = f"{self.service}.{method}"
        while True:
            md = (*self._metadata.items(), ("x-request-id", uuid.uuid4().hex[:16]))
            endpoint = self.endpoint
            timed = self.deadlines.start(name, request, self.timeout_s) if self.deadlines is not None and not timeout_s else None
            ok, code = False, None
            try:
                reply = await getattr(self.stub, method)(
                    request, timeout=timed.deadline_s if timed else timeout_s or self.timeout_s, metadata=md)
                ok = True
            except grpc.aio.AioRpcError as e:
                code, err = e.code(), error_from_rpc(e, name)
            finally:  # a cancelled call is neither measured nor late
                if timed is not None:
                    self.deadlines.finish(timed, ok, late=code == grpc.StatusCode.DEADLINE_EXCEEDED)
            if ok:
                return reply
            if self.resend_after_failure is None or not await self.resend_after_failure(err, endpoint):
                raise err

    async def wait_healthy(self, timeout_s: float = 60, poll_s: float = 0.2, service: str = "") -> None:
        """Poll grpc.health.v1 Check until SERVING; Unavailable naming the endpoint on timeout."""
        stub = health_pb2_grpc.HealthStub(self._channel)
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            left = deadline - time.monotonic()
            try:
                resp = await stub.Check(health_pb2.HealthCheckRequest(service=service),
                                        timeout=max(min(left, 5.0), 0.05))
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.aio.AioRpcError as e:
                last = f"{e.code().name}: {e.details()}"
            if time.monotonic() + poll_s > deadline:
                raise Unavailable(f"{self.service} at {self.endpoint} not SERVING after {timeout_s:g}s "
                                  f"(last: {last})")
            await asyncio.sleep(poll_s)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "ServiceClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
