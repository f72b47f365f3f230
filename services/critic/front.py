"""The critic service's front door (rank 0): CriticWorker's API over the rank group."""
from __future__ import annotations

from services.critic.worker import CriticWorker
from tandem.data.batch import DataProto
from tandem.dist.dispatch import check_lockstep, combine_train_metrics, gather_rows, layout, train_layout
from tandem.dist.rank_group import RankGroup
from tandem.train.losses import loss_units


class CriticFront:
    def __init__(self, group: RankGroup, local: CriticWorker):
        self.group = group
        self.local = local
        self.cfg = local.cfg
        self.critic_cfg = local.critic_cfg
        self.vocab_size = local.vocab_size
        self.dp = group.dp_size
        self.lockstep = self.critic_cfg.megatron.expert_model_parallel_size > 1  # see check_lockstep
        self.update_calls = 0

    def _rows_per_mini(self, batch: DataProto) -> int:
        n = int(batch.meta.get("rollout_n", self.cfg.actor_rollout_ref.rollout.n))
        return self.critic_cfg.ppo_mini_batch_size * n

    def compute_values(self, batch: DataProto) -> DataProto:
        lay = layout(batch, self._rows_per_mini(batch), self.dp)
        micro = self.critic_cfg.ppo_micro_batch_size_per_gpu
        if self.lockstep:
            check_lockstep(lay, micro)
        results = self.group.run("critic", "values", [(s, micro) for s in lay.shards])
        return gather_rows(lay, results, len(batch))

    def update_critic(self, batch: DataProto) -> dict[str, float]:
        c = self.critic_cfg
        lay = train_layout(batch, self._rows_per_mini(batch), self.dp, epochs=c.ppo_epochs, shuffle=False,
                           seed=self.cfg.trainer.seed + self.update_calls,
                           units=lambda mini: loss_units(mini["response_mask"], c.loss_agg_mode))
        if self.lockstep:
            check_lockstep(lay, c.ppo_micro_batch_size_per_gpu)
        results = self.group.run("critic", "update", [(s,) for s in lay.shards])
        self.update_calls += 1
        return combine_train_metrics(results, len(lay.minis))

    def save(self, path: str) -> str:
        return self.group.run_all("critic", "save", path, {"update_calls": self.update_calls})[0]

    def load(self, path: str, trunk_only: bool) -> int:
        if trunk_only:
            self.group.run_all("critic", "load_trunk", path)
            return 0
        meta = self.group.run_all("critic", "load", path)[0]
        self.update_calls = int(meta["update_calls"])
        return self.update_calls
