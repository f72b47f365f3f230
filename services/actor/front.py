"""The actor service's API over its rank group (tandem/serving/front.py does the laying out).

It also keeps the service-level counters: the weights version and update calls (which
checkpoints carry) and the mutation count (bumped before anything changes the policy's weights:
the weight plane's check that a transfer was not torn by an update, tandem/weights/source.py).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from tandem.data.batch import DataProto
from tandem.rpc.errors import InvalidArgument
from tandem.services.actor.worker import ActorWorker
from tandem.serving.front import FrontDoor
from tandem.serving.rank_group import RankGroup
from tandem.train.losses import ON_POLICY_ROW, loss_units
from tandem.train.microbatch import actor_split, ref_split


class Update(NamedTuple):
    """What one PPO update gives back."""

    metrics: dict[str, float]  # mini-batch means, e.g. actor/pg_loss, actor/ppo_kl, actor/grad_norm
    old_log_probs: DataProto | None  # 'old_log_probs' [B, R] as it used them (None over several epochs)
    update_rows: int  # the leading rows whose old log-probs were its own forward's


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

    def _rows_per_mini(self, rows: DataProto) -> int:
        n = int(rows.meta.get("rollout_n", self.cfg.actor_rollout_ref.rollout.n))
        return self.actor_cfg.ppo_mini_batch_size * n

    def update_rows(self, rows: DataProto) -> int:
        """How many leading rows of `rows` an update trains on the weights it starts from, so that
        their old log-probs (verl's: the policy's as the update starts) are its own forward's
        (detached: the numbers a log-prob pass would give; ppo_kl is 0 on them): every row of a
        single mini-batch, else the first mini-batch when it is trained first (unshuffled); none
        over several epochs."""
        a, per_mini = self.actor_cfg, self._rows_per_mini(rows)
        if a.ppo_epochs != 1:
            return 0
        if len(rows) <= per_mini:
            return len(rows)
        return 0 if a.shuffle else per_mini

    def log_probs(self, batch: DataProto, calculate_entropy: bool = False, with_reference: bool = False,
                  before_update: bool = False) -> tuple[DataProto, int]:
        """ComputeLogProb: compute_log_prob, leaving out the rows the update that follows computes
        itself when `before_update` -> (its output, how many leading rows it left out)."""
        skip = self.update_rows(batch) if before_update else 0
        return self.compute_log_prob(batch, calculate_entropy, with_reference, skip), skip

    def compute_log_prob(self, batch: DataProto, calculate_entropy: bool = False,
                         with_reference: bool = False, skip: int = 0) -> DataProto:
        """Old log-probs of the current policy: 'old_log_probs' [B, R] (+ 'entropys'; with_reference:
        + 'ref_log_prob', the reference's pass right after, in this call); the first `skip` rows' are
        0 (the update computes them: update_rows).

        Same mini-batch / DP / micro-batch layout as the update, so a pass on the first mini-batch
        gives the update's own forward's numbers."""
        per_mini = self._rows_per_mini(batch)
        micro, micro_ref = actor_split(self.actor_cfg), ref_split(self.cfg.actor_rollout_ref.ref, self.actor_cfg)
        rows = batch.slice(skip, len(batch))
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
        skipped = torch.zeros(skip, batch["responses"].shape[1])
        tensors = {"old_log_probs": torch.cat([skipped, out.tensors.get("log_probs", skipped[:0])])}
        if calculate_entropy:
            tensors["entropys"] = torch.cat([skipped, out.tensors.get("entropys", skipped[:0])])
        if with_reference:  # every row skipped: the reference's pass alone
            tensors["ref_log_prob"] = (ref["log_probs"] if ref is not None
                                       else self.compute_ref_log_prob(batch)["ref_log_prob"])
        return DataProto(tensors=tensors)

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        """The frozen reference's log-probs: 'ref_log_prob' [B, R]."""
        micro = ref_split(self.cfg.actor_rollout_ref.ref, self.actor_cfg)
        out = self.door.map_rows("log_probs", batch, "ref", float(batch.meta.get("temperature", 1.0)), False,
                                 micro, rows_per_mini=len(batch), micro=micro)
        return DataProto(tensors={"ref_log_prob": out["log_probs"]})

    def check_update(self, batch: DataProto) -> int:
        """UpdateActor's batch carries old_log_probs for every row the update does not compute
        itself (INVALID_ARGUMENT otherwise, before anything changes) -> update_rows."""
        own = self.update_rows(batch)
        if own < len(batch) and "old_log_probs" not in batch.tensors:
            raise InvalidArgument(f"tensor 'old_log_probs': required for rows {own}..{len(batch) - 1} (only the "
                                  f"first {own} rows are trained on the weights that generated them: "
                                  "ComputeLogProb with before_update gives the others)")
        return own

    def update_actor(self, batch: DataProto) -> Update:
        """One PPO update (ppo_epochs, mini- and micro-batches) on `batch` (advantages, old_log_probs of
        the rows after update_rows, ...)."""
        own = self.check_update(batch)
        batch = batch.union(DataProto(tensors={ON_POLICY_ROW: torch.arange(len(batch)) < own}))
        self.mutations += 1
        a = self.actor_cfg
        metrics, rows = self.door.train_with_rows(
            "update", batch, float(batch.meta.get("temperature", 1.0)),
            rows_per_mini=self._rows_per_mini(batch), micro=actor_split(a),
            epochs=a.ppo_epochs, shuffle=a.shuffle, seed=self.cfg.trainer.seed + self.update_calls,
            units=lambda mini: loss_units(mini["response_mask"], a.loss_agg_mode))
        self.update_calls += 1
        self.weights_version += 1
        return Update(metrics, rows, own)

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
