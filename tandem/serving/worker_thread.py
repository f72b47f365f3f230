"""WorkerThread: runs model work off the asyncio event loop, one call at a time.

The gRPC server's event loop only decodes, validates and encodes; the
worker's methods (forward, backward, generation) run on this single thread,
so they are serialised in arrival order and never block the loop (health
checks keep answering during a long update). structlog contextvars (step,
request id) are copied into the worker call so its log lines carry them.

A call whose RPC is cancelled is not interrupted: the thread finishes it and
the result is dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class WorkerThread:
    """A single-thread executor with an awaitable `run`."""

    def __init__(self, name: str = "tandem-worker"):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run fn(*args, **kwargs) on the worker thread and await its result."""
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        return await loop.run_in_executor(self._executor, functools.partial(ctx.run, fn, *args, **kwargs))

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future:
        """Queue fn now (not when a coroutine first runs) -> its future: a call queued right behind
        another starts the moment that one ends, with no turn of the event loop between them."""
        ctx = contextvars.copy_context()
        return self._executor.submit(ctx.run, fn, *args, **kwargs)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run fn on the worker thread from outside an event loop and wait for its result
        (a service's start-up work, so that all model work runs on this one thread)."""
        return self._executor.submit(fn, *args, **kwargs).result()

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting work; drop queued calls; optionally wait for the running one."""
        self._executor.shutdown(wait=wait, cancel_futures=True)
