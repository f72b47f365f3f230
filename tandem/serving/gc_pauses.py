"""Python's cyclic garbage collector, timed: every collection in this process, by generation.

A collection stops every Python thread. A service process holds ~0.5-1M tracked objects (torch,
megatron, compiled graphs): a full (generation 2) collection scans them all, ~0.1-0.3 s, at a
moment set by allocation counts, not by the caller: in the middle of a log-prob pass or an update
the GPU then runs dry. The call observer (call_observer.py) logs what each call paid.
"""
from __future__ import annotations

import gc
import threading
import time

_lock = threading.Lock()
_totals = {"gc_s": 0.0, "collections": 0, "full": 0, "full_s": 0.0}
_started: list[float] = []  # the running collection's start (collections do not nest)


def _callback(phase: str, info: dict) -> None:
    if phase == "start":
        _started[:] = [time.perf_counter()]
        return
    if not _started:  # installed during a collection
        return
    took = time.perf_counter() - _started.pop()
    with _lock:
        _totals["gc_s"] += took
        _totals["collections"] += 1
        if info.get("generation") == 2:
            _totals["full"] += 1
            _totals["full_s"] += took


def install() -> None:
    """Start timing collections (once per process)."""
    if _callback not in gc.callbacks:
        gc.callbacks.append(_callback)


def totals() -> dict:
    """Seconds and counts so far: gc_s over `collections`, full_s over `full` (generation 2) ones."""
    with _lock:
        return dict(_totals)


def since(before: dict) -> dict:
    """What was paid since `before` (a `totals()`)."""
    now = totals()
    return {k: now[k] - before[k] for k in now}
