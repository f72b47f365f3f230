"""The actor service's front door (rank 0): the ActorWorker API over the whole rank group.

It lays each batch out over the data-parallel ranks (tandem/dist/dispatch.py), runs the
method on every rank (tandem/dist/rank_group.py) and reassembles the results. It also
keeps the service-level counters (weights version, update calls) that checkpoints carry.
"""
from __future__ import annotations

from services.actor.worker import ActorWorker
from tandem.data.batch import DataProto
from tandem.dist.dispatch import check_lockstep, combine_train_metrics, gather_rows, layout, train_layout
from tandem.dist.rank_group import RankGroup
from tandem.train.losses import loss_units


class ActorFront:
    def __init__(self, group: RankGroup, local: ActorWorker):
        self.group = group
        self.local = local  # rank 0's own shard (tests and the colocated rollout read it)
        self.cfg = local.cfg
        self.actor_cfg = local.actor_cfg
        self.vocab_size = local.vocab_size
        self.dp = group.dp_size
        self.lockstep = self.actor_cfg.megatron.expert_model_parallel_size > 1  # see check_lockstep
        self.weights_version = 0
        self.update_calls = 0

    @classmethod
    def in_process(cls, cfg, tokenizer_len: int) -> "ActorFront":
        """A one-rank actor in this process (tests, benches): the service's own code path."""
        local = ActorWorker(cfg, tokenizer_len)
        return cls(RankGroup({"actor": local}), local)

    def _rows_per_mini(self, batch: DataProto) -> int:
        n = int(batch.meta.get("rollout_n", self.cfg.actor_rollout_ref.rollout.n))
        return self.actor_cfg.ppo_mini_batch_size * n

    def _log_probs(self, batch: DataProto, which: str, entropy: bool, rows_per_mini: int,
                   micro_rows: int) -> DataProto:
        lay = layout(batch, rows_per_mini, self.dp)
        if self.lockstep:
            check_lockstep(lay, micro_rows)
        temperature = float(batch.meta.get("temperature", 1.0))
        results = self.group.run("actor", "log_probs",
                                 [(s, which, temperature, entropy, micro_rows) for s in lay.shards])
        return gather_rows(lay, results, len(batch))

    def compute_log_prob(self, batch: DataProto, calculate_entropy: bool = False) -> DataProto:
        """Old log-probs of the current policy: 'old_log_probs' [B, R] (+ 'entropys').

        Same mini-batch / DP / micro-batch layout as the update, so the first on-policy
        mini-batch recomputes bit-identical log-probs (ppo_kl == 0 exactly)."""
        out = self._log_probs(batch, "policy", calculate_entropy, self._rows_per_mini(batch),
                              self.actor_cfg.ppo_micro_batch_size_per_gpu)
        tensors = {"old_log_probs": out["log_probs"]}
        if calculate_entropy:
            tensors["entropys"] = out["entropys"]
        return DataProto(tensors=tensors)

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        out = self._log_probs(batch, "ref", False, len(batch),
                              self.cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu)
        return DataProto(tensors={"ref_log_prob": out["log_probs"]})

    def update_actor(self, batch: DataProto) -> dict[str, float]:
        a = self.actor_cfg
        lay = train_layout(batch, self._rows_per_mini(batch), self.dp, epochs=a.ppo_epochs,
                           shuffle=a.shuffle, seed=self.cfg.trainer.seed + self.update_calls,
                           units=lambda mini: loss_units(mini["response_mask"], a.loss_agg_mode))
        if self.lockstep:
            check_lockstep(lay, a.ppo_micro_batch_size_per_gpu)
        temperature = float(batch.meta.get("temperature", 1.0))
        results = self.group.run("actor", "update", [(s, temperature) for s in lay.shards])
        self.update_calls += 1
        self.weights_version += 1
        return combine_train_metrics(results, len(lay.minis))

    def train_sft(self, batch: DataProto) -> dict[str, float]:
        """One optimizer step of cross-entropy on batch['loss_mask'] tokens."""
        lay = train_layout(batch, len(batch), self.dp, epochs=1, shuffle=False, seed=0,  # tokens predicted:
                           units=lambda mini: loss_units(mini["loss_mask"][:, 1:], "token-mean"))
        if self.lockstep:
            check_lockstep(lay, self.actor_cfg.ppo_micro_batch_size_per_gpu)
        results = self.group.run("actor", "train_sft", [(s,) for s in lay.shards])
        self.weights_version += 1
        return combine_train_metrics(results, 1)

    def set_reference(self) -> None:
        self.group.run_all("actor", "set_reference")

    def export_weights(self):
        """Full weights in the TP=1, PP=1 layout (gathered over TP, EP and pipeline stages)."""
        return self.group.run_all("actor", "export_weights")[0]

    def export_hf(self, out_dir: str) -> str:
        """The current policy as a Hugging Face directory (safetensors, config.json, tokenizer)."""
        tokenizer = self.cfg.actor_rollout_ref.model.tokenizer_path
        return self.group.run_all("actor", "export_hf", out_dir, tokenizer)[0]

    def save(self, path: str) -> str:
        meta = {"weights_version": self.weights_version, "update_calls": self.update_calls}
        return self.group.run_all("actor", "save", path, meta)[0]

    def load(self, path: str) -> int:
        meta = self.group.run_all("actor", "load", path)[0]
        self.weights_version = int(meta["weights_version"])
        self.update_calls = int(meta["update_calls"])
        return self.weights_version
