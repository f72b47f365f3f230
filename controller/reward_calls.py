"""Calling the reward service without ever inventing a score.

`score_rows` makes one Score call with the configured deadline (`reward_model.timeout_s`),
retries a call answered UNAVAILABLE or RESOURCE_EXHAUSTED up to `reward_model.max_retries` times
with exponential backoff from `reward_model.retry_backoff_s` (scoring is idempotent), and turns
what could not be scored into failed rows: those the service listed (ScoreResponse.failures),
or every row of a call that failed for good (deadline, crash, internal error, a reply with the
wrong row count). A failed row's score is NaN.

`settle` applies `reward_model.on_failure`: `fail` raises RewardFailure naming the rows and
reasons (the step, and so the run, fails); `drop` logs them and returns the rows to keep: every
row of a prompt group with a failed row is dropped (group estimators need whole groups), and the
step counts `reward/failed_rows`. Either way the log line names the behaviour.

A request the service calls malformed (INVALID_ARGUMENT) or unauthorised (UNAUTHENTICATED,
PERMISSION_DENIED) is a bug or a misconfiguration, not a reward failure: it is raised as is.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import grpc
import torch

from tandem.data.batch import DataProto
from tandem.logging import get_logger
from tandem.rpc.errors import TandemError

_log = get_logger("controller.reward")
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
NOT_A_REWARD_FAILURE = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                        grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED)


class RewardFailure(RuntimeError):
    """Rows could not be scored and reward_model.on_failure=fail."""


@dataclass
class RowScores:
    scores: torch.Tensor  # [B] float32, NaN where failed
    failures: dict[int, str]  # row -> reason


def _all_failed(n: int, reason: str) -> RowScores:
    return RowScores(torch.full((n,), math.nan), {i: reason for i in range(n)})


async def score_rows(reward, batch: DataProto, cfg) -> RowScores:
    """One Score call with retries -> scores and failed rows (see the module docstring)."""
    r, n = cfg.reward_model, len(batch)
    for attempt in range(r.max_retries + 1):
        try:
            scores, failures = await reward.score_rows(batch)
        except TandemError as e:
            if e.code in NOT_A_REWARD_FAILURE:
                raise
            if e.code in RETRIED and attempt < r.max_retries:
                wait = r.retry_backoff_s * 2 ** attempt
                _log.warning("reward.retry", attempt=attempt + 1, max_retries=r.max_retries, wait_s=wait, error=str(e))
                await asyncio.sleep(wait)
                continue
            tries = f" after {attempt + 1} attempts" if e.code in RETRIED else ""
            return _all_failed(n, f"{e.code.name}{tries}: {e}")
        if len(scores) != n:
            return _all_failed(n, f"the reward service at {reward.endpoint} returned {len(scores)} values in "
                                  f"'scores' for {n} rows (one per row, in row order)")
        bad = [i for i in failures if not 0 <= i < n]
        if bad:
            return _all_failed(n, f"the reward service reported failures for rows {bad[:5]} of {n}")
        values = torch.tensor(scores, dtype=torch.float32)
        for i in (~torch.isfinite(values)).nonzero().flatten().tolist():
            failures.setdefault(i, f"the reward service returned a non-finite score {scores[i]!r}")
        values[list(failures)] = math.nan
        return RowScores(values, failures)
    raise AssertionError("unreachable")  # pragma: no cover


def _describe(failures: dict[int, str], limit: int = 5) -> str:
    shown = "; ".join(f"row {i}: {failures[i]}" for i in sorted(failures)[:limit])
    more = len(failures) - limit
    return shown + (f"; and {more} more" if more > 0 else "")


def settle(scored: RowScores, group_size: int, cfg, where: str = "step") -> torch.Tensor | None:
    """Apply reward_model.on_failure -> None (nothing failed), or the row indices to keep
    (on_failure=drop: whole prompt groups of `group_size` rows). Raises RewardFailure (fail)."""
    failures = scored.failures
    if not failures:
        return None
    n, policy = len(scored.scores), cfg.reward_model.on_failure
    detail = _describe(failures)
    if policy == "fail":
        _log.error("reward.rows_failed", on_failure="fail", where=where, failed_rows=len(failures), rows=n,
                   detail=detail)
        raise RewardFailure(f"reward: {len(failures)} of {n} rows could not be scored ({where}; "
                            f"reward_model.on_failure=fail): {detail}")
    groups = torch.arange(n) // group_size
    bad_groups = torch.zeros(n // group_size + 1, dtype=torch.bool)
    bad_groups[groups[sorted(failures)]] = True
    keep = (~bad_groups[groups]).nonzero().flatten()
    _log.warning("reward.rows_failed", on_failure="drop", where=where, failed_rows=len(failures), rows=n,
                 dropped_rows=n - len(keep), detail=detail)
    return keep
