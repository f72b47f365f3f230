"""The actor service's API over its rank group (tandem/serving/front.py does the laying out).

It also keeps the service-level counters: the weights version and update calls (which
checkpoints carry) and the mutation count (bumped before anything changes the policy's weights:
the weight plane's check that a transfer was not torn by an update, tandem/weights/source.py).
"""
from __future__ import annotations

from tandem.data.batch import DataProto
from tandem.rpc.errors import InvalidArgument
from tandem.services.actor.worker import ActorWorker
from tandem.serving.front import FrontDoor
from tandem.serving.rank_group import RankGroup
from tandem.train.losses import loss_units


class ActorFront:
    def __init__(self, group: RankGroup, local: ActorWorker):
        self.group = group
        self.local = local  # rank 0's own shard (tests and the colocated rollout read it)
        self.cfg = local.cfg
        self.actor_cfg = local.actor_cfg
        self.vocab_size = local.vocab_size
        self.door = FrontDoor(group, "actor", lockstep=self.actor_cfg.megatron.expert_model_parallel_size > 1)
        self.weights_version = 0
        self.update_calls = 0
        self.mutations = 0

    @classmethod
    def in_process(cls, cfg, tokenizer_len: int) -> "ActorFront":
        """A one-rank actor in this process (tests, benches): the service's own code path."""
        local = ActorWorker(cfg, tokenizer_len)
        return cls(RankGroup({"actor": local}), local)

    def _rows_per_mini(self, batch: DataProto) -> int:
        n = int(batch.meta.get("rollout_n", self.cfg.actor_rollout_ref.rollout.n))
        return self.actor_cfg.ppo_mini_batch_size * n

    def compute_log_prob(self, batch: DataProto, calculate_entropy: bool = False,
                         with_reference: bool = False) -> DataProto:
        """Old log-probs of the current policy: 'old_log_probs' [B, R] (+ 'entropys'; with_reference:
        + 'ref_log_prob', compute_ref_log_prob's pass right after, in this call).

        Same mini-batch / DP / micro-batch layout as the update, so the first on-policy
        mini-batch recomputes bit-identical log-probs (ppo_kl == 0 exactly)."""
        micro = self.actor_cfg.ppo_micro_batch_size_per_gpu
        out = self.door.map_rows("log_probs", batch, "policy", float(batch.meta.get("temperature", 1.0)),
                                 calculate_entropy, micro, rows_per_mini=self._rows_per_mini(batch),
                                 micro_rows=micro)
        tensors = {"old_log_probs": out["log_probs"]}
        if calculate_entropy:
            tensors["entropys"] = out["entropys"]
        if with_reference:
            tensors.update(self.compute_ref_log_prob(batch).tensors)
        return DataProto(tensors=tensors)

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        micro = self.cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
        out = self.door.map_rows("log_probs", batch, "ref", float(batch.meta.get("temperature", 1.0)), False,
                                 micro, rows_per_mini=len(batch), micro_rows=micro)
        return DataProto(tensors={"ref_log_prob": out["log_probs"]})

    def update_actor(self, batch: DataProto) -> dict[str, float]:
        return self._update(batch, on_policy=False)[0]

    def update_actor_on_policy(self, batch: DataProto) -> tuple[dict[str, float], DataProto]:
        """update_actor for a batch without old_log_probs, when they are the current policy's
        (check_on_policy): the update's own forward gives them -> (metrics, 'old_log_probs' [B, R])."""
        self.check_on_policy(batch)
        return self._update(batch, on_policy=True)

    def check_on_policy(self, batch: DataProto) -> None:
        """Every row must be trained on the current weights: one mini-batch, one epoch."""
        a, rows = self.actor_cfg, self._rows_per_mini(batch)
        if a.ppo_epochs != 1 or len(batch) > rows:
            raise InvalidArgument(
                f"on_policy: {len(batch)} rows in mini-batches of {rows} (ppo_mini_batch_size x rollout_n) "
                f"over ppo_epochs={a.ppo_epochs}: rows after the first optimizer step are trained on newer "
                "weights than the ones that sampled them; send old_log_probs (ComputeLogProb) instead")

    def _update(self, batch: DataProto, on_policy: bool) -> tuple[dict[str, float], DataProto | None]:
        self.mutations += 1
        a = self.actor_cfg
        metrics, rows = self.door.train_with_rows(
            "update", batch, float(batch.meta.get("temperature", 1.0)), on_policy,
            rows_per_mini=self._rows_per_mini(batch), micro_rows=a.ppo_micro_batch_size_per_gpu,
            epochs=a.ppo_epochs, shuffle=a.shuffle, seed=self.cfg.trainer.seed + self.update_calls,
            units=lambda mini: loss_units(mini["response_mask"], a.loss_agg_mode))
        self.update_calls += 1
        self.weights_version += 1
        return metrics, rows

    def train_sft(self, batch: DataProto) -> dict[str, float]:
        """One optimizer step of cross-entropy on batch['loss_mask'] tokens."""
        self.mutations += 1
        metrics = self.door.train(  # loss units: the tokens predicted
            "train_sft", batch, rows_per_mini=len(batch), micro_rows=self.actor_cfg.ppo_micro_batch_size_per_gpu,
            units=lambda mini: loss_units(mini["loss_mask"][:, 1:], "token-mean"))
        self.weights_version += 1
        return metrics

    def set_reference(self) -> None:
        self.door.everywhere("set_reference")

    def export_weights(self):
        """Full weights in the TP=1, PP=1 layout (gathered over TP, EP and pipeline stages)."""
        return self.door.everywhere("export_weights")

    def stage_export(self):
        """The same on rank 0's device, without a copy through the control plane (the weight
        plane's snapshot): -> {TP=1 name: tensor}."""
        self.door.everywhere("stage_export")
        weights, self.local.exported = self.local.exported, None  # the caller owns them now
        return weights

    def export_hf(self, out_dir: str) -> str:
        """The current policy as a Hugging Face directory (safetensors, config.json, tokenizer)."""
        return self.door.everywhere("export_hf", out_dir, self.cfg.actor_rollout_ref.model.tokenizer_path)

    def save(self, path: str) -> str:
        return self.door.everywhere("save", path, {"weights_version": self.weights_version,
                                                   "update_calls": self.update_calls})

    def load(self, path: str) -> int:
        self.mutations += 1
        meta = self.door.everywhere("load", path)
        self.weights_version = int(meta["weights_version"])
        self.update_calls = int(meta["update_calls"])
        return self.weights_version
