"""A process-wide request to stop generating, for a run that is being cancelled.

A long-lived service sets it when its run is interrupted (LifecycleService.Interrupt, on the
gRPC event loop while the worker thread generates) and clears it when it takes or gives back
a run. The engine looks at it before each scheduler step and raises GenerationAborted, so a
long generation is cut within one decode step. Only an engine whose model is not split over
tensor-parallel ranks looks: the other ranks of a TP group never see the request (it reaches
rank 0 only) and would wait forever in the next collective; a TP > 1 generation finishes.
"""
from __future__ import annotations

import threading

_requested = threading.Event()


class GenerationAborted(RuntimeError):
    """The generation stopped early because its run is being cancelled."""


def request() -> None:
    _requested.set()


def clear() -> None:
    _requested.clear()


def requested() -> bool:
    return _requested.is_set()


def check() -> None:
    if _requested.is_set():
        raise GenerationAborted("generation interrupted: the run is being cancelled")
