"""verl's LR schedule keys (optim.lr_warmup_*, lr_decay_*, min_lr, lr_wsd_*) through megatron-core's
OptimizerParamScheduler (tandem/train/optim.py), and their config checks."""
import math

import pytest

from tandem.config import ConfigError, OptimConfig, load_config
from tandem.train.optim import lr_schedule


def lrs(cfg: OptimConfig, total: int | None, steps: int, per_step: int = 1) -> list[float]:
    """The LR of optimizer steps 1..steps, as the Optimizer reads it."""
    schedule = lr_schedule(cfg, total, per_step)
    out = []
    for k in range(1, steps + 1):
        schedule.num_steps = k
        out.append(schedule.get_lr({}))
    return out


def test_default_is_linear_warmup_then_constant():
    assert lrs(OptimConfig(lr=5e-4, lr_warmup_steps=10), 2, 12) == \
        pytest.approx([5e-4 * min(1.0, k / 10) for k in range(1, 13)], rel=1e-12)
    assert lrs(OptimConfig(lr=1e-3), None, 3) == [1e-3] * 3


def test_decay_styles_warmup_ratio_and_min_lr():
    cosine = lrs(OptimConfig(lr=1e-3, lr_warmup_steps=2, lr_decay_style="cosine", min_lr=1e-4), 10, 12)
    assert cosine[:2] == pytest.approx([5e-4, 1e-3]) and cosine[9:] == pytest.approx([1e-4] * 3)
    assert cosine[5] == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 4 / 8)))
    linear = lrs(OptimConfig(lr=1e-3, lr_warmup_steps=-1, lr_warmup_steps_ratio=0.2, lr_decay_style="linear"), 10, 10)
    assert linear[:2] == pytest.approx([5e-4, 1e-3]) and linear[-1] == pytest.approx(0.0, abs=1e-12)
    decays_over = lrs(OptimConfig(lr=1e-3, lr_decay_style="linear", lr_decay_steps=4), 100, 5)
    assert decays_over == pytest.approx([7.5e-4, 5e-4, 2.5e-4, 0.0, 0.0])
    wsd = lrs(OptimConfig(lr=1e-3, lr_decay_style="WSD", lr_wsd_decay_steps=2, lr_wsd_decay_style="linear"), 6, 6)
    assert wsd == pytest.approx([1e-3, 1e-3, 1e-3, 1e-3, 5e-4, 0.0])
    # the keys count training steps (verl's): 2 optimizer steps a training step stretch the curve over them
    assert lrs(OptimConfig(lr=1e-3, lr_decay_style="linear", lr_decay_steps=2, lr_warmup_steps=1), 100, 6, 2) == \
        pytest.approx([5e-4, 1e-3, 5e-4, 0.0, 0.0, 0.0])


def test_bad_schedules_name_the_key():
    key = "actor_rollout_ref.actor.optim"
    with pytest.raises(ConfigError, match=rf"{key}.lr_decay_style: 'steps'; known: \('constant', 'linear'"):
        load_config(None, [f"{key}.lr_decay_style=steps"])
    with pytest.raises(ConfigError, match=r"critic.optim.min_lr: 1.0 must be in \[0, lr=0.001\]"):
        load_config(None, ["critic.optim.min_lr=1.0"])
    with pytest.raises(ConfigError, match=rf"{key}.lr_warmup_steps: 10 warmup steps must be fewer than the 5 steps"):
        load_config(None, [f"{key}.lr_decay_style=cosine", "trainer.total_training_steps=5"])
    with pytest.raises(ConfigError, match=rf"{key}.lr_wsd_decay_steps: must be >= 1 with lr_decay_style=WSD"):
        load_config(None, [f"{key}.lr_decay_style=WSD"])
    cfg = load_config(None, [f"{key}.lr_decay_style=cosine", f"{key}.min_lr=1e-5", f"{key}.lr_decay_steps=100"])
    assert cfg.actor_rollout_ref.actor.optim.lr_decay_steps == 100
