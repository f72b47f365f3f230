"""ActorWorker: the policy and its frozen reference on this rank; plain Python, no gRPC.

Methods take and return DataProto. The servicer validates requests before they get here.
"""
from __future__ import annotations

import functools

import torch

from tandem import checkpoint
from tandem.algos import metrics as M
from tandem.config import TandemConfig
from tandem.data.batch import DataProto
from tandem.models.build import build_gpt_model
from tandem.models.shape_from_config import model_shape
from tandem.train import losses
from tandem.train.microbatch import micro_batches, mini_batches
from tandem.train.optim import Optimizer
from tandem.train.step import train_steps


class ActorWorker:
    def __init__(self, cfg: TandemConfig, tokenizer_len: int):
        self.cfg = cfg
        self.actor_cfg = cfg.actor_rollout_ref.actor
        self.shape = model_shape(cfg.actor_rollout_ref.model, tokenizer_len)
        self.vocab_size = self.shape.vocab_size
        self.policy = build_gpt_model(self.shape)
        if cfg.actor_rollout_ref.model.path:  # start from the Hugging Face checkpoint
            from megatron.core import parallel_state as ps

            from tandem.convert.hf_load import load_hf_weights

            load_hf_weights(self.policy, cfg.actor_rollout_ref.model.path, self.shape,
                            ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size())
        self.ref = build_gpt_model(self.shape)  # megatron modules hold process groups: no deepcopy
        self.set_reference()
        self.optimizer = Optimizer(self.policy.parameters(), self.actor_cfg.optim)
        self.sft_optimizer: Optimizer | None = None
        self.weights_version = 0
        self.update_calls = 0

    # ---- log-probs -------------------------------------------------------------------
    @torch.no_grad()
    def _log_probs(self, model, batch: DataProto, temperature: float, entropy: bool,
                   micro_rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        model.eval()
        parts, ents = [], []
        for mb in micro_batches(batch, micro_rows):
            lp, ent = losses.response_log_probs(model, mb, temperature, with_entropy=entropy)
            parts.append(lp.cpu())
            if entropy:
                ents.append(ent.cpu())
        return torch.cat(parts), (torch.cat(ents) if entropy else None)

    def compute_log_prob(self, batch: DataProto, calculate_entropy: bool = False) -> DataProto:
        """Old log-probs of the current policy: 'old_log_probs' [B, R] (+ 'entropys').

        Uses the update's micro-batch size, so the first on-policy mini-batch recomputes
        bit-identical log-probs (ppo_kl == 0 exactly).
        """
        temperature = float(batch.meta.get("temperature", 1.0))
        lp, ent = self._log_probs(self.policy, batch, temperature, calculate_entropy,
                                  self.actor_cfg.ppo_micro_batch_size_per_gpu)
        out = {"old_log_probs": lp}
        if ent is not None:
            out["entropys"] = ent
        return DataProto(tensors=out)

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        temperature = float(batch.meta.get("temperature", 1.0))
        lp, _ = self._log_probs(self.ref, batch, temperature, False,
                                self.cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu)
        return DataProto(tensors={"ref_log_prob": lp})

    # ---- training --------------------------------------------------------------------
    def update_actor(self, batch: DataProto) -> dict[str, float]:
        a = self.actor_cfg
        temperature = float(batch.meta.get("temperature", 1.0))
        n = int(batch.meta.get("rollout_n", self.cfg.actor_rollout_ref.rollout.n))
        minis = mini_batches(batch, a.ppo_mini_batch_size * n, a.ppo_epochs, a.shuffle,
                             seed=self.cfg.trainer.seed + self.update_calls)
        loss_fn = functools.partial(losses.ppo_actor_loss, cfg=a, temperature=temperature)
        metrics = train_steps(self.policy, self.optimizer, minis, a.ppo_micro_batch_size_per_gpu,
                              lambda model, mb: loss_fn(model, mb), M.ACTOR_GRAD_NORM, M.ACTOR_LR)
        self.update_calls += 1
        self.weights_version += 1
        return metrics

    def train_sft(self, batch: DataProto) -> dict[str, float]:
        """One optimizer step of cross-entropy on batch['loss_mask'] tokens (warm start)."""
        sft = self.cfg.trainer.sft
        if self.sft_optimizer is None:
            from tandem.config import OptimConfig

            self.sft_optimizer = Optimizer(self.policy.parameters(),
                                           OptimConfig(lr=sft.lr, weight_decay=sft.weight_decay))
        metrics = train_steps(self.policy, self.sft_optimizer, [batch],
                              self.actor_cfg.ppo_micro_batch_size_per_gpu, losses.sft_loss,
                              "sft/grad_norm", "sft/lr")
        self.weights_version += 1
        return metrics

    def set_reference(self) -> None:
        """reference := current policy (after the SFT warm start)."""
        self.ref.load_state_dict(self.policy.state_dict())
        self.ref.requires_grad_(False)
        self.ref.eval()

    # ---- weights and checkpoints ------------------------------------------------------
    def export_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in checkpoint.model_weights(self.policy).items()}

    def save(self, path: str) -> str:
        return checkpoint.save_atomic({
            "policy": self.policy.state_dict(), "ref": self.ref.state_dict(),
            "optimizer": self.optimizer.state_dict(), "weights_version": self.weights_version,
            "update_calls": self.update_calls}, path)

    def load(self, path: str) -> int:
        state = checkpoint.load(path)
        self.policy.load_state_dict(state["policy"])
        self.ref.load_state_dict(state["ref"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.weights_version = state["weights_version"]
        self.update_calls = state["update_calls"]
        return self.weights_version
