"""Checks of async_training: the mode, the staleness bound, batches ahead, the stale-batch policy.

Generation overlaps training only with a standalone rollout: a colocated rollout is the actor's own
process and weights, so there is nothing to overlap (that mode stays synchronous).
"""
from __future__ import annotations

from tandem.config.errors import check
from tandem.config.schema import ASYNC_MODES, ON_STALE, TandemConfig


def check_async_training(cfg: TandemConfig) -> None:
    """async_training.*: known mode and policy, bounds >= their minimum, a standalone rollout."""
    a = cfg.async_training
    check(a.mode in ASYNC_MODES, "async_training.mode", f"{a.mode!r}; known: {', '.join(ASYNC_MODES)}")
    check(a.on_stale in ON_STALE, "async_training.on_stale", f"{a.on_stale!r}; known: {', '.join(ON_STALE)}")
    check(a.staleness_threshold >= 0, "async_training.staleness_threshold", f"{a.staleness_threshold} must be >= 0")
    check(a.max_inflight_batches >= 1, "async_training.max_inflight_batches",
          f"{a.max_inflight_batches} must be >= 1")
    if a.mode != "sync":
        check(cfg.actor_rollout_ref.rollout.mode == "standalone", "async_training.mode",
              f"{a.mode} needs actor_rollout_ref.rollout.mode=standalone (a colocated rollout shares the actor's "
              "process and weights: it stays synchronous)")
