"""The MoE router load-balancing loss in training, scaled to Tandem's loss normalisation.

The loss is megatron-core's `aux_loss` (moe_utils.switch_load_balancing_loss_func): per MoE
layer and micro-batch of T tokens, aux = E / (k T^2) * sum_e c_e * sum_x s(x, e), where s are
the router's softmax scores over all E experts and c_e counts the tokens that pick expert e
among their top k (1.0 when perfectly balanced). The objective added per mini-batch is

    coeff * sum over MoE layers of sum over micro-batches (T_mb / N) * aux_mb

with N the mini-batch's tokens over all micro-batches and data-parallel ranks. The routing
statistics are per micro-batch (as in Megatron-LM, and in transformers per forward call), but
the weights T_mb / N make the scale independent of how rows are split: one micro-batch per
mini-batch gives coeff x aux of the whole mini-batch.

Why not megatron's own attachment (moe_router_load_balancing_type in the TransformerConfig):
with calculate_per_token_loss it multiplies the loss by the micro-batch's token count so that
finalize_model_grads' division by the loss units gives a token mean; Tandem's units are
response tokens or rows, not routed tokens. How it counts those tokens also changed between
versions (0.16 counts the local sequence-parallel shard, which gives 1/TP of the gradient;
later versions reduce over TP), and so did its metrics tracker. Here a forward hook on each
router recomputes the gating logits (one [T, h] x [h, E] product), builds the loss over the
real tokens only (not the sequence-parallel filler), and attaches coeff x U x T_mb / N x aux
to the router's output (U: the mini-batch's loss units, which finalize_model_grads divides by).
The model's own load-balancing type stays "none" (tandem/models/spec.py).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from tandem.config import router_aux_loss_coeff
from tandem.data.batch import DataProto
from tandem.parallel import device
from tandem.train.microbatch import Split, micro_batches


class _AttachLoss(torch.autograd.Function):
    """Returns `output` unchanged; backward also sends gradient 1 into `loss` (the schedule
    backpropagates the main loss with gradient 1 too: no fp16 loss scaling here)."""

    @staticmethod
    def forward(ctx, output, loss):
        ctx.save_for_backward(loss)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (loss,) = ctx.saved_tensors
        return grad_output, torch.ones_like(loss)


@dataclass(frozen=True)
class _MicroBatch:
    units: float  # the mini-batch's loss units U (what finalize_model_grads divides by)
    tokens: float  # the mini-batch's tokens N, every micro-batch on every DP rank
    real: int  # this micro-batch's tokens T_mb (its packed length without filler)


class RouterLoadBalancing:
    """Hooks on the routers of one GPTModel (this rank's pipeline stage). Inactive except
    inside `update(...)`, so log-prob, reference and generation passes are unaffected."""

    def __init__(self, model, coeff: float, num_moe_layers: int):
        from megatron.core import parallel_state as ps
        from megatron.core.transformer.moe.router import TopKRouter

        config = model.config
        if config.moe_router_score_function != "softmax":
            raise ValueError(f"router load-balancing loss: score function {config.moe_router_score_function!r} "
                             "is not supported (softmax only)")
        self.model = model
        self.coeff = coeff
        self.num_moe_layers = num_moe_layers
        self.topk, self.num_experts = config.moe_router_topk, config.num_moe_experts
        sp = config.sequence_parallel and ps.get_tensor_model_parallel_world_size() > 1
        self.tp_group = ps.get_tensor_model_parallel_group() if sp else None
        self.tp_rank = ps.get_tensor_model_parallel_rank() if sp else 0
        self.metric_group = ps.get_model_parallel_group()  # TP shares (with SP) and PP stages' layers
        self._plan: list[_MicroBatch] = []
        self._index = -1
        self._metric = None  # device scalar while updating: no host sync per layer
        self._active = False
        for m in model.modules():
            if isinstance(m, TopKRouter):
                m.register_forward_hook(self._after_router)

    @contextmanager
    def update(self, minis: list[DataProto], micro: Split, metric_key: str) -> Iterator[dict]:
        """Around train_steps(model, ..., minis, micro, ...): each forward of the model is
        the next micro-batch of `minis` in order (the schedule's contract). Yields a dict that
        gets {metric_key: this rank's share of the mean per-layer loss, summed over minis} on
        exit, in train_steps' "weighted" convention (the front door sums DP ranks)."""
        for mini in minis:
            if "tokens" not in mini.meta:
                raise KeyError("router load-balancing loss: mini-batch meta has no 'tokens' "
                               "(tandem.serving.dispatch.train_layout sets it)")
        self._plan = [_MicroBatch(float(mini.meta["loss_units"]), float(mini.meta["tokens"]),
                                  int(mb["attention_mask"].sum()))
                      for mini in minis for mb in micro_batches(mini, micro)]
        self._index, self._active = -1, True
        self._metric = torch.zeros((), dtype=torch.float64, device=device.device())
        pre = self.model.register_forward_pre_hook(self._next_micro_batch)
        metrics: dict = {}
        try:
            yield metrics
        finally:
            pre.remove()
            self._active = False
        if self._index + 1 != len(self._plan):
            raise RuntimeError(f"router load-balancing loss: {self._index + 1} forwards for "
                               f"{len(self._plan)} micro-batches")
        total = self._metric
        if torch.distributed.get_world_size(self.metric_group) > 1:
            torch.distributed.all_reduce(total, group=self.metric_group)
        metrics[metric_key] = float(total) / self.num_moe_layers

    def _next_micro_batch(self, module, args):
        self._index += 1
        if self._index >= len(self._plan):
            raise RuntimeError(f"router load-balancing loss: more forwards than the {len(self._plan)} micro-batches")

    def _after_router(self, router, args, output):
        if not (self._active and router.training and torch.is_grad_enabled()):
            return None
        from megatron.core.transformer.moe.moe_utils import (
            switch_load_balancing_loss_func,
        )

        mb = self._plan[self._index]
        probs, routing_map = output
        logits = router.gating(args[0]).reshape(-1, self.num_experts)  # [t, E], t = this rank's tokens
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
        first = self.tp_rank * logits.shape[0]  # sequence parallel: rank r holds tokens [r t, (r+1) t)
        valid = (torch.arange(first, first + logits.shape[0], device=scores.device) < mb.real)[:, None]
        top = torch.topk(scores, k=self.topk, dim=-1).indices
        counts = torch.zeros_like(scores).scatter_(1, top, 1.0).mul_(valid).sum(0)
        if self.tp_group is not None:  # counts of the whole micro-batch
            torch.distributed.all_reduce(counts, group=self.tp_group)
        share = switch_load_balancing_loss_func(probs=scores * valid, tokens_per_expert=counts,
                                                total_num_tokens=mb.real, topk=self.topk,
                                                num_experts=self.num_experts, moe_aux_loss_coeff=1.0)
        weight = mb.real / mb.tokens  # this micro-batch's share of the mini-batch
        self._metric += share.detach().double() * weight
        return _AttachLoss.apply(probs, share * (self.coeff * mb.units * weight)), routing_map


class _Off:
    """The same API when there is no load-balancing loss (dense model, or coefficient 0)."""

    @contextmanager
    def update(self, minis, micro: Split, metric_key: str) -> Iterator[dict]:
        yield {}


def load_balancing(model, shape, megatron_cfg, model_cfg) -> RouterLoadBalancing | _Off:
    """The load-balancing loss a role trains `model` with (tandem.config.router_aux_loss_coeff)."""
    coeff = router_aux_loss_coeff(megatron_cfg, model_cfg) if shape.moe is not None else 0.0
    if coeff == 0.0:
        return _Off()
    return RouterLoadBalancing(model, coeff, len(shape.moe.moe_layers))
