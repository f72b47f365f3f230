"""What the rollout's gRPC callers of tool and environment services share: one channel per server in
the running event loop, a bound on calls in flight, and one unary call under a deadline with retries.

    channels = Channels(tools_pb2_grpc.ToolServiceStub, max_concurrency=256)
    stub, slots = channels.get(route)
    async with slots:
        reply, failure = await send(stub.CallTool, request, 10.0, max_retries=3, retry_backoff_s=0.1, request_id=id)

`send` never raises for a failed call (only cancellation passes): it answers (reply, None) or
(None, what went wrong). UNAVAILABLE and RESOURCE_EXHAUSTED are retried with exponential backoff
inside the deadline, a retry waiting for an unreachable server to come back (those codes say the
server did not take the call, so sending it again is safe). Deliberately not here: what a call
means (grpc_caller.py, grpc_episodes.py).
"""
from __future__ import annotations

import asyncio
import time

import grpc

from tandem.rpc.client import make_channel
from tandem.tools.tool_config import ToolRoute

RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
DETAILS_CHARS = 300  # a status message shown to the model is cut here: it is an observation, not a log


def check_settings(owner: str, timeout_s: float, max_retries: int, retry_backoff_s: float, max_concurrency: int) -> None:
    """A caller's deadline, retries and concurrency, or ValueError naming what is wrong."""
    if timeout_s <= 0 or max_retries < 0 or retry_backoff_s < 0 or max_concurrency < 1:
        raise ValueError(f"{owner}: timeout_s={timeout_s} must be > 0, max_retries={max_retries} and "
                         f"retry_backoff_s={retry_backoff_s} >= 0, max_concurrency={max_concurrency} >= 1")


class Channels:
    """Stubs of one service kind, a channel per (endpoint, security), opened on first use in the running
    loop (grpc.aio channels belong to one loop: a call from a new loop opens new ones)."""

    def __init__(self, stub_class, max_concurrency: int = 256, max_message_mb: int = 16):
        self.stub_class, self.max_concurrency, self.max_message_mb = stub_class, max_concurrency, max_message_mb
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stubs: dict[tuple, object] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._slots: asyncio.Semaphore | None = None

    def get(self, route: ToolRoute) -> tuple[object, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # channels and semaphores belong to the loop they were made in
            self._loop, self._stubs, self._channels = loop, {}, []
            self._slots = asyncio.Semaphore(self.max_concurrency)
        key = (route.endpoint, route.security)
        if key not in self._stubs:
            channel = make_channel(route.endpoint, self.max_message_mb, route.security)
            self._channels.append(channel)
            self._stubs[key] = self.stub_class(channel)
        return self._stubs[key], self._slots

    async def close(self) -> None:
        """Close the channels of the running loop's calls."""
        channels, self._channels, self._stubs, self._loop = self._channels, [], {}, None
        for channel in channels:
            await channel.close()


async def send(method, request, timeout_s: float, *, max_retries: int, retry_backoff_s: float,
               request_id: str) -> tuple[object | None, str | None]:
    """(the reply, None), or (None, what went wrong) after the retries and within the deadline."""
    deadline, last = time.monotonic() + timeout_s, None
    for attempt in range(max_retries + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            # a retry waits for the channel within the deadline: without wait_for_ready grpc fails it at
            # once until its own reconnect backoff has passed, so a restarting server would get no chance
            return await method(request, timeout=left, metadata=(("x-request-id", request_id),),
                                wait_for_ready=attempt > 0), None
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                break
            last = f"failed: {code.name}: {(e.details() or '')[:DETAILS_CHARS]}"
            if code not in RETRIED or attempt == max_retries:
                return None, last
            await asyncio.sleep(min(retry_backoff_s * 2 ** attempt, max(deadline - time.monotonic(), 0)))
    if last is not None:
        return None, f"{last} (retried for {timeout_s:g} s)"
    return None, f"timed out after {timeout_s:g} s"
