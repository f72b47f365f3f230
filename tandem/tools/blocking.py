"""A ToolCaller for synchronous code: the generation engine runs on a worker thread, not on an event
loop, so its tool calls run on this object's own loop in a daemon thread (one loop for its whole
life: the gRPC channels are opened once and stay open).

    tools = BlockingToolCaller(GrpcToolCaller.from_tool_config(cfg))
    future = tools.submit(calls)      # returns at once; decode the other rows meanwhile
    if future.done(): results = future.result()       # list[ToolResult], one per call
    results = tools.call(calls)       # or wait for them
    tools.close()

Deliberately not here: what a call does (the wrapped ToolCaller); results are never exceptions there,
so a future here fails only if this object was closed under it.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Sequence

from tandem.tools.calls import ToolCall, ToolCaller, ToolResult


class BlockingToolCaller:
    def __init__(self, caller: ToolCaller):
        self.caller = caller
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tool-calls", daemon=True)
        self._thread.start()

    def submit(self, calls: Sequence[ToolCall]) -> concurrent.futures.Future[list[ToolResult]]:
        """Start the calls; the future's result is one ToolResult per call, in order."""
        return asyncio.run_coroutine_threadsafe(self.caller.call(list(calls)), self._loop)

    def call(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        return self.submit(calls).result()

    def close(self) -> None:
        """Close the wrapped caller (its channels), then stop the loop and its thread."""
        if not self._thread.is_alive():
            return
        close = getattr(self.caller, "close", None)
        if close is not None:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
