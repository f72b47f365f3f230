"""What a step (controller/step.py) works with and what its phases hand on: the run's roles and
configuration (StepContext, with the rules that follow from it: which rows' old log-probs the
update computes), phase 2's log-probs and values, phase 3's advantages.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.config import TandemConfig
from tandem.controller.roles import Roles
from tandem.data.batch import DataProto


@dataclass(frozen=True)
class StepContext:
    """What every step of a run works with."""

    roles: Roles
    cfg: TandemConfig
    tokenizer: object
    kl_ctrl: object  # tandem.algos.kl controller: its coefficient moves when KL is in the reward

    @property
    def n(self) -> int:
        return self.cfg.actor_rollout_ref.rollout.n

    @property
    def use_critic(self) -> bool:
        return self.cfg.algorithm.adv_estimator == "gae"

    @property
    def n_gpus(self) -> int:
        """Devices the step runs on (verl's n_gpus): the largest model service, as roles share them."""
        s, standalone = self.cfg.services, self.cfg.actor_rollout_ref.rollout.mode == "standalone"
        return max(s.actor.world_size, s.critic.world_size if self.use_critic else 1,
                   s.rollout.world_size if standalone else 1)

    @property
    def need_ref(self) -> bool:
        return self.cfg.actor_rollout_ref.actor.use_kl_loss or self.cfg.algorithm.use_kl_in_reward

    def on_policy_rows(self, rows: int) -> int:
        """How many leading rows take the update's own forward's old log-probs (no separate pass for
        them): those trained on the sampling weights (every row of one mini-batch, else the first
        unshuffled mini-batch's; one epoch) when nothing needs them before the update (KL in the
        reward does); 0 with trainer.old_log_probs_from_update off."""
        a = self.cfg.actor_rollout_ref.actor
        per_mini = a.ppo_mini_batch_size * self.n
        if not self.cfg.trainer.old_log_probs_from_update or a.ppo_epochs != 1 or self.cfg.algorithm.use_kl_in_reward:
            return 0
        return rows if rows <= per_mini else 0 if a.shuffle else per_mini


@dataclass
class LogProbs:
    """Phase 2's outputs, one row per generated row."""

    old: DataProto | None  # old_log_probs [B, R]; on-policy updates fill it in (phase 4)
    ref: DataProto | None  # ref_log_prob [B, R], when KL is in the loss or the reward
    values: DataProto | None  # values [B, R], with a critic
    own: int = 0  # with `old`: its first rows are 0, the update computes them (phase 4 fills them in)


@dataclass
class Advantages:
    """Phase 3's outputs, all [B, R] over the response tokens."""

    mask: torch.Tensor  # response mask, float
    token_scores: torch.Tensor  # outcome reward on each row's last token
    rewards: torch.Tensor  # token_scores minus the KL penalty when it is in the reward
    advantages: torch.Tensor
    returns: torch.Tensor
