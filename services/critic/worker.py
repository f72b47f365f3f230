"""CriticWorker: this rank's shard of the value model (GPTModel trunk + scalar head).

Plain Python, no gRPC; the front door (services/critic/front.py) lays batches out over
DP ranks and runs the same method on every rank. Memory (tandem/train/phases.py): with
critic.megatron.{param,grad,optimizer}_offload the critic's state leaves the GPU after each
call (the critic is its own process, and may share the GPU with the actor and its rollout).
"""
from __future__ import annotations

import functools

import torch

from tandem import checkpoint
from tandem.algos import metrics as M
from tandem.config import TandemConfig
from tandem.config.transformer_overrides import passed_overrides
from tandem.data.batch import DataProto
from tandem.models.scalar_head import build_scalar_model
from tandem.models.shape_from_config import model_shape
from tandem.train import losses
from tandem.train.memory_metrics import memory_metrics
from tandem.train.microbatch import Split, critic_split
from tandem.train.moe_aux_loss import load_balancing
from tandem.train.optim import Optimizer, wrap_ddp
from tandem.train.phases import MemoryPhases, grads_group, optimizer_group, params_group
from tandem.train.step import forward_rows, train_steps

CRITIC_PHASES = {"values": {"params"}, "train": {"params", "grads", "optimizer"}, "checkpoint": {"params", "optimizer"}}


class CriticWorker:
    """weights_follow: the trunk is built without drawing weights, because a load comes before any use
    (critic.init_from_policy: the run loads the policy's trunk; a resume loads a critic checkpoint);
    until then `weights_loaded` is False and the service refuses values, updates and saves."""

    def __init__(self, cfg: TandemConfig, tokenizer_len: int, weights_follow: bool = False):
        self.cfg = cfg
        self.critic_cfg = cfg.critic
        m = cfg.critic.megatron
        self.shape = model_shape(cfg.actor_rollout_ref.model, tokenizer_len)
        self.vocab_size = self.shape.vocab_size
        self.model = build_scalar_model(self.shape, m, self.critic_cfg.use_torch_compile, passed_overrides(m),
                                        weights_follow=weights_follow)
        self.weights_loaded = not weights_follow
        self.ddp = wrap_ddp(self.model, m.use_distributed_optimizer)
        per_step = max(1, cfg.data.train_batch_size // self.critic_cfg.ppo_mini_batch_size) * self.critic_cfg.ppo_epochs
        self.optimizer = Optimizer(self.ddp, self.critic_cfg.optim, cfg.trainer.total_training_steps, per_step)
        self.load_balancing = load_balancing(self.model, self.shape, m, cfg.actor_rollout_ref.model)
        self.memory = MemoryPhases(CRITIC_PHASES, idle_after_call=True)
        self.memory.add(params_group("params", self.model, m.param_offload))
        self.memory.add(grads_group(self.ddp, m.grad_offload))
        self.memory.add(optimizer_group(lambda: [self.optimizer], self.model, m.optimizer_offload))

    @torch.no_grad()
    def values(self, shards: list[DataProto | None], micro: Split) -> list[DataProto | None]:
        with self.memory.phase("values"):
            return self._values(shards, micro)

    def _values(self, shards: list[DataProto | None], micro: Split) -> list[DataProto | None]:
        self.ddp.eval()

        def loss_fn(output, mb):
            return output.new_zeros(()), 0, {"values": losses.values_of(output, mb)}  # read back once per call

        return forward_rows(self.ddp, shards, micro, loss_fn)

    def update(self, shards: list[DataProto]) -> dict:
        loss_fn = functools.partial(losses.critic_loss, cfg=self.critic_cfg)
        micro = critic_split(self.critic_cfg)
        with self.memory.phase("train"), \
                self.load_balancing.update(shards, micro, M.CRITIC_MOE_LOAD_BALANCING_LOSS) as moe_metrics:
            out = train_steps(self.ddp, self.optimizer, shards, micro, loss_fn, M.CRITIC_GRAD_NORM, "critic/lr")
            out["steps"].update(memory_metrics("critic"))
        out["weighted"].update(moe_metrics)
        return out

    def save(self, path: str, meta: dict) -> str:
        with self.memory.phase("checkpoint"):
            return checkpoint.save_models(path, {"critic": self.model}, self.optimizer, meta)

    def load(self, path: str) -> dict:
        with self.memory.phase("checkpoint"):
            meta = checkpoint.load_models(path, {"critic": self.model}, self.optimizer)
        self.weights_loaded = True
        return meta

    def load_trunk(self, actor_path: str) -> None:
        """The trunk from an actor checkpoint's policy (any TP layout); this value head stays."""
        with self.memory.phase("checkpoint"):
            self._load_trunk(actor_path)
        self.weights_loaded = True

    def _load_trunk(self, actor_path: str) -> None:
        trunk = {k: v for k, v in self.model.sharded_state_dict(prefix="policy.").items()
                 if not k.startswith("output_layer.")}
        state = checkpoint.load_sharded(checkpoint.stage_on_host({"policy": trunk}), actor_path)
        checkpoint.check_finite(state, actor_path)
        missing, unexpected = self.model.load_state_dict(
            checkpoint.strip_prefix(state["policy"], "policy."), strict=False)
        missing = [k for k in missing if not k.startswith("output_layer.")]
        if missing or unexpected:
            raise KeyError(f"trunk mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.optimizer.reload_model_params()
