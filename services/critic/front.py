"""The critic service's API over its rank group (tandem/serving/front.py does the laying out)."""
from __future__ import annotations

from tandem.data.batch import DataProto
from tandem.services.critic.worker import CriticWorker
from tandem.serving.front import FrontDoor
from tandem.serving.rank_group import RankGroup
from tandem.train.losses import loss_units
from tandem.train.microbatch import critic_split


class CriticFront:
    def __init__(self, group: RankGroup, local: CriticWorker):
        self.group = group
        self.local = local
        self.cfg = local.cfg
        self.critic_cfg = local.critic_cfg
        self.vocab_size = local.vocab_size
        self.door = FrontDoor(group, "critic", lockstep=self.critic_cfg.megatron.expert_model_parallel_size > 1)
        self.update_calls = 0

    def _rows_per_mini(self, batch: DataProto) -> int:
        n = int(batch.meta.get("rollout_n", self.cfg.actor_rollout_ref.rollout.n))
        return self.critic_cfg.ppo_mini_batch_size * n

    def compute_values(self, batch: DataProto) -> DataProto:
        micro = critic_split(self.critic_cfg, forward=True)
        return self.door.map_rows("values", batch, micro, rows_per_mini=self._rows_per_mini(batch), micro=micro)

    def update_critic(self, batch: DataProto) -> dict[str, float]:
        c = self.critic_cfg
        metrics = self.door.train(
            "update", batch, rows_per_mini=self._rows_per_mini(batch), micro=critic_split(c),
            epochs=c.ppo_epochs, seed=self.cfg.trainer.seed + self.update_calls,
            units=lambda mini: loss_units(mini["response_mask"], c.loss_agg_mode))
        self.update_calls += 1
        return metrics

    def save(self, path: str) -> str:
        return self.door.everywhere("save", path, {"update_calls": self.update_calls})

    def load(self, path: str, trunk_only: bool) -> int:
        if trunk_only:
            self.door.everywhere("load_trunk", path)
            return 0
        meta = self.door.everywhere("load", path)
        self.update_calls = int(meta["update_calls"])
        return self.update_calls
