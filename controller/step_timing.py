"""Timing a step's phases (verl's `timing_s/*` keys) and awaiting calls that may be absent."""
from __future__ import annotations

import time
from contextlib import contextmanager


@contextmanager
def timed(metrics: dict, key: str):
    """Add the block's wall-clock seconds to metrics[key] (a phase run several times adds up)."""
    t0 = time.perf_counter()
    yield
    metrics[key] = metrics.get(key, 0.0) + time.perf_counter() - t0


async def timed_await(coro, metrics: dict, key: str):
    """Await `coro` (None: nothing), timing it as metrics[key]."""
    if coro is None:
        return None
    with timed(metrics, key):
        return await coro


async def maybe(coro):
    return await coro if coro is not None else None
