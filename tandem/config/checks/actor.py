"""Checks of the actor's loss settings: mini-batches, loss aggregation, policy loss, clipping, TIS.

The loss aggregation modes and policy loss modes are those of tandem.algos (aggregate.LOSS_AGG_MODES,
losses.POLICY_LOSS_MODES): a mode added there is valid here. The actor's parallel layout is in
parallel.py.
"""
from __future__ import annotations

from tandem.algos.aggregate import LOSS_AGG_MODES
from tandem.algos.losses import POLICY_LOSS_MODES
from tandem.config.errors import check
from tandem.config.schema import TandemConfig


def check_actor(cfg: TandemConfig) -> None:
    """actor_rollout_ref.actor.*: mini-batch size, loss_agg_mode, policy_loss.loss_mode, clip_ratio_c."""
    a, d = cfg.actor_rollout_ref.actor, cfg.data
    check(a.ppo_mini_batch_size >= 1 and d.train_batch_size % a.ppo_mini_batch_size == 0,
          "actor_rollout_ref.actor.ppo_mini_batch_size",
          f"{a.ppo_mini_batch_size} must divide data.train_batch_size={d.train_batch_size}")
    check(a.loss_agg_mode in LOSS_AGG_MODES, "actor_rollout_ref.actor.loss_agg_mode",
          f"unknown mode {a.loss_agg_mode!r}")
    check(a.policy_loss.loss_mode in POLICY_LOSS_MODES, "actor_rollout_ref.actor.policy_loss.loss_mode",
          f"{a.policy_loss.loss_mode!r}; known: {sorted(POLICY_LOSS_MODES)}")
    check(a.clip_ratio_c > 1, "actor_rollout_ref.actor.clip_ratio_c", "must be > 1 (dual-clip bound)")


def check_tis(cfg: TandemConfig) -> None:
    """actor_rollout_ref.actor.tis_imp_ratio_cap: truncated importance sampling is off (<= 0) or caps at >= 1."""
    a = cfg.actor_rollout_ref.actor
    check(a.tis_imp_ratio_cap <= 0 or a.tis_imp_ratio_cap >= 1, "actor_rollout_ref.actor.tis_imp_ratio_cap",
          f"{a.tis_imp_ratio_cap} must be >= 1 (a cap below 1 shrinks every on-policy token) or <= 0 (off)")
