"""The actor service's API over its rank group (tandem/serving/front.py does the laying out).

It also keeps the service-level counters: the weights version and update calls (which
checkpoints carry) and the mutation count (bumped before anything changes the policy's weights:
the weight plane's check that a transfer was not torn by an update, tandem/weights/source.py).
"""
from __future__ import annotations

import torch

from tandem.data.batch import DataProto
from tandem.rpc.errors import InvalidArgument
from tandem.services.actor.worker import ActorWorker
from tandem.serving.front import FrontDoor
from tandem.serving.rank_group import RankGroup
from tandem.train.losses import ON_POLICY_ROW, loss_units
from tandem.train.microbatch import Split, actor_split, ref_split


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
                         with_reference: bool = False, policy_from_row: int = 0) -> DataProto:
        """Old log-probs of the current policy: 'old_log_probs' [B, R] (+ 'entropys'; with_reference:
        + 'ref_log_prob', compute_ref_log_prob's pass right after, in this call). policy_from_row:
        the policy's pass starts there (whole mini-batches); the rows before it are the update's own
        (update_actor_on_policy's `rows`) and come back as 0.

        Same mini-batch / DP / micro-batch layout as the update, so the first on-policy
        mini-batch recomputes bit-identical log-probs (ppo_kl == 0 exactly)."""
        per_mini = self._rows_per_mini(batch)
        self.check_policy_from_row(policy_from_row, len(batch), per_mini)
        micro, micro_ref = actor_split(self.actor_cfg), self._ref_micro()
        rows = batch.slice(policy_from_row, len(batch))
        temperature = float(batch.meta.get("temperature", 1.0))
        ref = None
        if not len(rows):
            out = DataProto()
        elif with_reference:  # both passes back to back, read back once (no GPU gap between them)
            out, ref = self.door.map_rows_pair("log_probs_pair", rows, batch, temperature, calculate_entropy, micro,
                                               micro_ref, rows_per_mini=(per_mini, len(batch)),
                                               micro=(micro, micro_ref))
        else:
            out = self.door.map_rows("log_probs", rows, "policy", temperature, calculate_entropy, micro,
                                     rows_per_mini=per_mini, micro=micro)
        skipped = torch.zeros(policy_from_row, batch["responses"].shape[1])  # the update computes them
        tensors = {"old_log_probs": torch.cat([skipped, out.tensors.get("log_probs", skipped[:0])])}
        if calculate_entropy:
            tensors["entropys"] = torch.cat([skipped, out.tensors.get("entropys", skipped[:0])])
        if with_reference:
            tensors["ref_log_prob"] = (ref["log_probs"] if ref is not None
                                       else self.compute_ref_log_prob(batch)["ref_log_prob"])
        return DataProto(tensors=tensors)

    def check_policy_from_row(self, policy_from_row: int, rows: int, per_mini: int) -> None:
        """ComputeLogProb's policy_from_row: whole mini-batches of `per_mini` rows within `rows`."""
        if policy_from_row < 0 or policy_from_row % per_mini or policy_from_row > rows:
            raise InvalidArgument(f"policy_from_row: {policy_from_row} is not a whole number of mini-batches of "
                                  f"{per_mini} rows within the batch's {rows}")

    def _ref_micro(self) -> Split:
        return ref_split(self.cfg.actor_rollout_ref.ref, self.actor_cfg)

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        micro = self._ref_micro()
        out = self.door.map_rows("log_probs", batch, "ref", float(batch.meta.get("temperature", 1.0)), False,
                                 micro, rows_per_mini=len(batch), micro=micro)
        return DataProto(tensors={"ref_log_prob": out["log_probs"]})

    def update_actor(self, batch: DataProto) -> dict[str, float]:
        return self._update(batch, on_policy=False)[0]

    def update_actor_on_policy(self, batch: DataProto, rows: int = 0) -> tuple[dict[str, float], DataProto]:
        """update_actor where the update's own forward gives the old log-probs of the rows trained on
        the current weights (check_on_policy): every row (rows=0: the batch carries no old_log_probs),
        or the first `rows` (the first mini-batch; the batch's old_log_probs of the others are used)
        -> (metrics, 'old_log_probs' [B, R] as the update used them)."""
        self.check_on_policy(batch, rows)
        if rows:
            batch = batch.union(DataProto(tensors={ON_POLICY_ROW: torch.arange(len(batch)) < rows}))
        return self._update(batch, on_policy=not rows)

    def check_on_policy(self, batch: DataProto, rows: int = 0) -> None:
        """Every row given the update's own old log-probs must be trained on the current weights:
        one mini-batch (or the first one, unshuffled), one epoch."""
        a, per_mini = self.actor_cfg, self._rows_per_mini(batch)
        if rows:
            if a.ppo_epochs != 1 or a.shuffle or rows != per_mini or rows >= len(batch):
                raise InvalidArgument(
                    f"on_policy_rows: {rows} rows of {len(batch)} take the update's own old log-probs; that is "
                    f"only the first mini-batch ({per_mini} rows = ppo_mini_batch_size x rollout_n), of a batch "
                    f"with more, over ppo_epochs=1 (got {a.ppo_epochs}) with the actor's shuffle off (got {a.shuffle})")
            if "old_log_probs" not in batch.tensors:
                raise InvalidArgument("on_policy_rows: the batch carries no old_log_probs for the rows after the "
                                      "first mini-batch")
            return
        if a.ppo_epochs != 1 or len(batch) > per_mini:
            raise InvalidArgument(
                f"on_policy: {len(batch)} rows in mini-batches of {per_mini} (ppo_mini_batch_size x rollout_n) "
                f"over ppo_epochs={a.ppo_epochs}: rows after the first optimizer step are trained on newer "
                "weights than the ones that sampled them; send old_log_probs (ComputeLogProb) instead")

    def _update(self, batch: DataProto, on_policy: bool) -> tuple[dict[str, float], DataProto | None]:
        self.mutations += 1
        a = self.actor_cfg
        metrics, rows = self.door.train_with_rows(
            "update", batch, float(batch.meta.get("temperature", 1.0)), on_policy,
            rows_per_mini=self._rows_per_mini(batch), micro=actor_split(a),
            epochs=a.ppo_epochs, shuffle=a.shuffle, seed=self.cfg.trainer.seed + self.update_calls,
            units=lambda mini: loss_units(mini["response_mask"], a.loss_agg_mode))
        self.update_calls += 1
        self.weights_version += 1
        return metrics, rows

    def train_sft(self, batch: DataProto) -> dict[str, float]:
        """One optimizer step of cross-entropy on batch['loss_mask'] tokens."""
        self.mutations += 1
        metrics = self.door.train(  # loss units: the tokens predicted
            "train_sft", batch, rows_per_mini=len(batch), micro=actor_split(self.actor_cfg),
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
