"""The rollout's ToolCaller over gRPC: each tool call goes to the ToolService its route names
(tandem/tools/tool_config.py), all calls of a batch concurrently, each under its own deadline.

    caller = GrpcToolCaller.from_tool_config(load_tool_config(path, default_endpoint), timeout_s=30)
    results = await caller.call([ToolCall("calculator", {"expression": "12*34"})])   # [ToolResult("408", True)]
    async for i, result in caller.call_as_completed(calls): ...   # each result as soon as it is in
    await caller.close()

A call's `kwargs` (the row's verl tools_kwargs entry for the tool) go as `instance_kwargs_json`.

Never raises for a failed call (only cancellation passes): an unknown tool, arguments that are not
a JSON object, kwargs that are not one, a deadline passed, a status other than OK, a tool's own
error (is_error) and an empty answer each become ToolResult(ok=False, text="error: ...") that the
model is shown and that names the tool. UNAVAILABLE and RESOURCE_EXHAUSTED are retried with
exponential backoff inside the call's deadline (tandem/tools/rpc_calls.py: a tool call is assumed
safe to repeat when the server did not take it, which is what those codes say). One channel per
server, opened on first use in the running event loop. A slow call holds only its own row:
`call_as_completed` yields the others first; `call` returns when the last is done.

Deliberately not here: parsing the model's text into calls, and truncating observations (the
rollout's job); EnvironmentService episodes (tandem/tools/grpc_episodes.py).
"""
from __future__ import annotations

import asyncio
import json
import uuid
from typing import AsyncIterator, Mapping, Sequence

from tandem.logging import get_logger
from tandem.tools.calls import ToolCall, ToolResult
from tandem.tools.rpc_calls import DETAILS_CHARS, Channels, check_settings, send
from tandem.tools.tool_config import ToolConfig, ToolRoute
from tandem.v1 import tools_pb2, tools_pb2_grpc

_log = get_logger("tandem.tools")


def error(text: str) -> ToolResult:
    return ToolResult(f"error: {text}", False)


class GrpcToolCaller:
    """routes: tool name -> ToolRoute (endpoint, security, optional timeout). timeout_s: each call's
    deadline, retries included (a route's own timeout_s wins). max_retries: further attempts after
    UNAVAILABLE / RESOURCE_EXHAUSTED, waiting retry_backoff_s, then twice that, ... max_concurrency:
    calls in flight at once over all servers (the rest queue)."""

    def __init__(self, routes: Mapping[str, ToolRoute], *, timeout_s: float = 30.0, max_retries: int = 3,
                 retry_backoff_s: float = 0.1, max_concurrency: int = 256, max_message_mb: int = 16):
        check_settings("GrpcToolCaller", timeout_s, max_retries, retry_backoff_s, max_concurrency)
        self.routes = dict(routes)
        self.timeout_s, self.max_retries, self.retry_backoff_s = timeout_s, max_retries, retry_backoff_s
        self.max_concurrency, self.max_message_mb = max_concurrency, max_message_mb
        self._channels = Channels(tools_pb2_grpc.ToolServiceStub, max_concurrency, max_message_mb)

    @classmethod
    def from_tool_config(cls, config: ToolConfig, **kw) -> GrpcToolCaller:
        return cls(config.routes, **kw)

    async def call(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One result per call, in order; failures are results with ok=False, never exceptions."""
        return list(await asyncio.gather(*(self.call_one(c) for c in calls)))

    async def call_as_completed(self, calls: Sequence[ToolCall]) -> AsyncIterator[tuple[int, ToolResult]]:
        """(index in `calls`, result) for each call, as each finishes; leaving the loop early cancels the rest."""
        async def indexed(i: int, c: ToolCall) -> tuple[int, ToolResult]:
            return i, await self.call_one(c)

        tasks = [asyncio.ensure_future(indexed(i, c)) for i, c in enumerate(calls)]
        try:
            for done in asyncio.as_completed(tasks):
                yield await done
        finally:
            for t in tasks:
                t.cancel()

    async def call_one(self, call: ToolCall) -> ToolResult:
        try:
            return await self._call_one(call)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug or a bad TLS file must not stop the rollout
            _log.warning("tool.call_failed", tool=call.name, error=f"{type(e).__name__}: {e}")
            return error(f"tool {call.name!r} could not be called: {type(e).__name__}: {str(e)[:DETAILS_CHARS]}")

    async def _call_one(self, call: ToolCall) -> ToolResult:
        route = self.routes.get(call.name)
        if route is None:
            return error(f"unknown tool {call.name!r}; the tools are: {', '.join(sorted(self.routes)) or 'none'}")
        arguments, kwargs = _arguments_json(call), _kwargs_json(call)
        for bad in (arguments, kwargs):
            if isinstance(bad, ToolResult):
                return bad
        timeout_s = route.timeout_s or self.timeout_s
        call_id = uuid.uuid4().hex[:16]
        request = tools_pb2.CallToolRequest(name=call.name, arguments_json=arguments, call_id=call_id,
                                            instance_kwargs_json=kwargs)
        stub, slots = self._channels.get(route)
        async with slots:  # the deadline starts when the call is sent, not while it queues
            reply, failure = await send(stub.CallTool, request, timeout_s, max_retries=self.max_retries,
                                        retry_backoff_s=self.retry_backoff_s, request_id=call_id)
        if failure is not None:
            _log.info("tool.call_failed", tool=call.name, call_id=call_id, failure=failure)
            return error(f"tool {call.name!r} {failure}")
        if reply.is_error:
            return ToolResult(reply.text or f"error: tool {call.name!r} failed and said nothing", False)
        if not reply.text:
            return error(f"tool {call.name!r} answered an empty observation")
        return ToolResult(reply.text, True)

    async def close(self) -> None:
        """Close the channels of the running loop's calls."""
        await self._channels.close()


def _arguments_json(call: ToolCall) -> str | ToolResult:
    """The call's arguments as JSON text, or the error result the model sees."""
    args = call.arguments
    if isinstance(args, str):  # the model's text, if the parser passed it on unparsed
        try:
            args = json.loads(args)
        except ValueError as e:
            return error(f"tool {call.name!r}: the arguments are not valid JSON: {e}")
    if not isinstance(args, dict):
        return error(f"tool {call.name!r}: the arguments must be a JSON object, got {type(args).__name__}")
    try:
        return json.dumps(args, allow_nan=False)
    except (TypeError, ValueError) as e:
        return error(f"tool {call.name!r}: the arguments are not JSON: {e}")


def _kwargs_json(call: ToolCall) -> str | ToolResult:
    """The row's kwargs for the tool as JSON text ("" for none), or the error result the model sees:
    bad data fails that row's call, never the rollout."""
    if call.kwargs is None:
        return ""
    if not isinstance(call.kwargs, dict):
        return error(f"tool {call.name!r}: the row's tools_kwargs for it must be a JSON object, "
                     f"got {type(call.kwargs).__name__}")
    try:
        return json.dumps(call.kwargs, allow_nan=False)
    except (TypeError, ValueError) as e:
        return error(f"tool {call.name!r}: the row's tools_kwargs are not JSON: {e}")
