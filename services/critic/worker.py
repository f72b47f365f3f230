"""CriticWorker: a GPTModel trunk with a scalar value head; plain Python, no gRPC."""
from __future__ import annotations

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


class CriticWorker:
    def __init__(self, cfg: TandemConfig, tokenizer_len: int):
        self.cfg = cfg
        self.critic_cfg = cfg.critic
        self.shape = model_shape(cfg.actor_rollout_ref.model, tokenizer_len)
        self.vocab_size = self.shape.vocab_size
        self.model = build_gpt_model(self.shape, head="scalar")
        self.optimizer = Optimizer(self.model.parameters(), self.critic_cfg.optim)
        self.update_calls = 0

    @torch.no_grad()
    def compute_values(self, batch: DataProto) -> DataProto:
        self.model.eval()
        parts = [losses.values_of(self.model, mb).cpu()
                 for mb in micro_batches(batch, self.critic_cfg.ppo_micro_batch_size_per_gpu)]
        return DataProto(tensors={"values": torch.cat(parts)})

    def update_critic(self, batch: DataProto) -> dict[str, float]:
        c = self.critic_cfg
        n = int(batch.meta.get("rollout_n", self.cfg.actor_rollout_ref.rollout.n))
        minis = mini_batches(batch, c.ppo_mini_batch_size * n, c.ppo_epochs, False,
                             seed=self.cfg.trainer.seed + self.update_calls)
        metrics = train_steps(self.model, self.optimizer, minis, c.ppo_micro_batch_size_per_gpu,
                              lambda model, mb: losses.critic_loss(model, mb, c),
                              M.CRITIC_GRAD_NORM, "critic/lr")
        self.update_calls += 1
        return metrics

    def save(self, path: str) -> str:
        return checkpoint.save_atomic({"critic": self.model.state_dict(),
                                       "optimizer": self.optimizer.state_dict(),
                                       "update_calls": self.update_calls}, path)

    def load(self, path: str, trunk_only: bool) -> int:
        """trunk_only: take an actor checkpoint's policy trunk, keep this value head."""
        state = checkpoint.load(path)
        if trunk_only:
            if "policy" not in state:
                raise KeyError("not an actor checkpoint (no 'policy' entry)")
            trunk = {k: v for k, v in state["policy"].items() if not k.startswith("output_layer.")}
            missing, unexpected = self.model.load_state_dict(trunk, strict=False)
            missing = [k for k in missing if not k.startswith("output_layer.") and not k.endswith("_extra_state")]
            if missing or unexpected:
                raise KeyError(f"trunk mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
            return 0
        self.model.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.update_calls = state["update_calls"]
        return self.update_calls
