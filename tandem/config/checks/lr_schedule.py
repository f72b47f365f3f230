"""Checks of the LR schedule keys (verl's, run by megatron-core's OptimizerParamScheduler in
tandem/train/optim.py) of the actor's and the critic's optimizers."""
from __future__ import annotations

from tandem.config.errors import check
from tandem.config.schema import OptimConfig, TandemConfig

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WSD_DECAY_STYLES = ("exponential", "linear", "cosine")


def check_lr_schedules(cfg: TandemConfig) -> None:
    """actor_rollout_ref.actor.optim.* and critic.optim.*: known decay styles, bounds in order."""
    total = cfg.trainer.total_training_steps
    _check_schedule("actor_rollout_ref.actor.optim", cfg.actor_rollout_ref.actor.optim, total)
    _check_schedule("critic.optim", cfg.critic.optim, total)


def _check_schedule(key: str, o: OptimConfig, total_steps: int | None) -> None:
    check(o.lr_decay_style in DECAY_STYLES, f"{key}.lr_decay_style", f"{o.lr_decay_style!r}; known: {DECAY_STYLES}")
    check(0 <= o.min_lr <= o.lr, f"{key}.min_lr", f"{o.min_lr} must be in [0, lr={o.lr}]")
    check(0 <= o.lr_warmup_init <= o.lr, f"{key}.lr_warmup_init", f"{o.lr_warmup_init} must be in [0, lr={o.lr}]")
    check(0 <= o.lr_warmup_steps_ratio <= 1, f"{key}.lr_warmup_steps_ratio", f"{o.lr_warmup_steps_ratio} must be "
          "in [0, 1] (used when lr_warmup_steps < 0)")
    check(o.lr_decay_steps is None or o.lr_decay_steps >= 1, f"{key}.lr_decay_steps", "must be >= 1 (or null: "
          "trainer.total_training_steps)")
    if o.lr_decay_style == "constant":
        return
    decay = o.lr_decay_steps or total_steps
    if decay is not None:
        warmup = o.lr_warmup_steps if o.lr_warmup_steps >= 0 else int(o.lr_warmup_steps_ratio * decay)
        check(warmup < decay, f"{key}.lr_warmup_steps", f"{warmup} warmup steps must be fewer than the {decay} "
              f"steps the LR decays over ({key}.lr_decay_steps, else trainer.total_training_steps)")
    if o.lr_decay_style == "WSD":
        check(o.lr_wsd_decay_style in WSD_DECAY_STYLES, f"{key}.lr_wsd_decay_style",
              f"{o.lr_wsd_decay_style!r}; known: {WSD_DECAY_STYLES}")
        check(o.lr_wsd_decay_steps is not None and o.lr_wsd_decay_steps >= 1, f"{key}.lr_wsd_decay_steps",
              "must be >= 1 with lr_decay_style=WSD (the steps of its final decay)")
