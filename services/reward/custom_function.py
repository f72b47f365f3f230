"""verl's custom reward function: `compute_score(data_source, solution_str, ground_truth,
extra_info)` from a Python file, run in a process pool with a per-call timeout.

The file and function come from `custom_reward_function.path` / `.name`; extra keyword
arguments from `.reward_kwargs` (verl's keys). A call returns a number, or a dict whose
`score` entry is the score (verl's two shapes; the dict's other entries are not used yet).
Each row is one call in a pebble ProcessPool: a call running longer than `timeout_s` is killed
(its worker process is replaced), and a call that raises, times out, kills its process or returns
something else leaves that row failed with the reason (result.Scored): never a score of 0.

The pool's processes start from a fork server, not from this process (which runs gRPC threads
and perhaps a model): each imports only this module and the user's file
(tandem/reward/function_file.py). The file is also imported once here at start, so a missing
file or function stops the service before it serves; `tandem run` imports it once more before
anything starts, and the service imports it only from its --allow-dir directories.
"""
from __future__ import annotations

import math
import multiprocessing
import numbers
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

from pebble import ProcessExpired, ProcessPool

from tandem.logging import get_logger
from tandem.reward.function_file import load_function
from tandem.services.reward.result import Scored

_log = get_logger("services.reward.custom_function")
_FUNCTION: Callable | None = None  # in a pool process: the loaded compute_score


def _init_worker(path: str, name: str) -> None:
    global _FUNCTION
    _FUNCTION = load_function(path, name)


def _call(data_source, solution_str, ground_truth, extra_info, kwargs):
    return _FUNCTION(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                     extra_info=extra_info, **kwargs)


class BadReturn(ValueError):
    """compute_score returned something that is not a score."""


def as_score(value: Any, name: str) -> float:
    """verl's return shapes (a number, or a dict with 'score') -> a finite float; BadReturn otherwise."""
    if isinstance(value, dict):
        if "score" not in value:
            raise BadReturn(f"{name} returned a dict without 'score' (keys {sorted(map(str, value))[:8]})")
        value = value["score"]
    if not isinstance(value, numbers.Real):
        raise BadReturn(f"{name} returned {type(value).__name__}, not a number or a dict with 'score'")
    score = float(value)
    if not math.isfinite(score):
        raise BadReturn(f"{name} returned a non-finite score {score!r}")
    return score


class CustomRewardFunction:
    """Scores rows with the user's compute_score; `close()` stops the pool."""

    def __init__(self, path: str, name: str = "compute_score", reward_kwargs: dict | None = None,
                 timeout_s: float = 10.0, num_workers: int = 2):
        load_function(path, name)  # fail at startup, not on the first batch
        self.name, self.timeout_s = name, timeout_s
        self.kwargs = dict(reward_kwargs or {})
        self.pool = ProcessPool(max_workers=num_workers, initializer=_init_worker, initargs=(path, name),
                                context=multiprocessing.get_context("forkserver"))

    def _outcome(self, future) -> float | str:
        """The row's score, or why there is none."""
        try:
            return as_score(future.result(), self.name)
        except FutureTimeout:
            return f"{self.name} exceeded custom_reward_function.timeout_s={self.timeout_s:g} (killed)"
        except ProcessExpired as e:
            return f"{self.name}'s process died (exit code {e.exitcode})"
        except BadReturn as e:
            return str(e)
        except Exception as e:  # noqa: BLE001 - whatever the user's function raised
            return f"{self.name} raised {type(e).__name__}: {e}"

    def score(self, response_text: list[str], ground_truth: list[str], data_source: list[str] | None = None,
              extra_info: list[dict] | None = None, prompt_text: list[str] | None = None) -> Scored:
        n = len(response_text)
        sources = data_source if data_source is not None else [""] * n
        extras = extra_info if extra_info is not None else [{}] * n
        futures = [self.pool.schedule(_call, args=(sources[i], response_text[i], ground_truth[i], extras[i] or {},
                                                   self.kwargs), timeout=self.timeout_s) for i in range(n)]
        outcomes = [self._outcome(f) for f in futures]
        failures = {i: o for i, o in enumerate(outcomes) if isinstance(o, str)}
        for row, reason in failures.items():
            _log.warning("reward.row_failed", row=row, reason=reason)
        return Scored.of([0.0 if isinstance(o, str) else o for o in outcomes], failures)

    def close(self) -> None:
        self.pool.stop()  # a call still hanging is killed, not waited for
        self.pool.join(timeout=2)
