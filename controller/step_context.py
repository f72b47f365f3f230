"""What a step (controller/step.py) works with and what its phases hand on: the run's roles and
configuration (StepContext, with the rules that follow from it) and the advantages.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.config import TandemConfig
from tandem.controller.roles import Roles


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

    def update_follows(self, step: int) -> bool:
        """The actor updates on this step's rows right after their log-probs, nothing reading those
        in between (KL in the reward does): its update computes the old log-probs of the rows it
        trains on the sampling weights itself (ComputeLogProb's before_update)."""
        return step > self.cfg.trainer.critic_warmup and not self.cfg.algorithm.use_kl_in_reward


@dataclass
class Advantages:
    """Phase 3's outputs, all [B, R] over the response tokens."""

    mask: torch.Tensor  # response mask, float
    token_scores: torch.Tensor  # outcome reward on each row's last token
    rewards: torch.Tensor  # token_scores minus the KL penalty when it is in the reward
    advantages: torch.Tensor
    returns: torch.Tensor
