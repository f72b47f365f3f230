"""Log-probs and entropy from (vocab-parallel) logits: one definition for actor AND rollout.

Logits are the model's [..., V/tp] vocab shard. Temperature is applied here (logits / T)
so rollout log-probs and the actor's recomputed log-probs are the same quantity.
Computation is fp32 whatever the model dtype.
"""
from __future__ import annotations

import torch


def _tp_group():
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_group()


def _tp_size() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_world_size()


def scale_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 copy of logits / temperature (always a new tensor: callers may modify it)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    return logits.float() / temperature


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor,
                          temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T)[labels]. logits [..., V/tp], labels [...] -> [...] fp32."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    # megatron's CE subtracts the max in place: give it its own tensor.
    return -vocab_parallel_cross_entropy(scale_logits(logits, temperature), labels)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / T) over the full (TP-split) vocabulary. [..., V/tp] -> [...]."""
    z = scale_logits(logits, temperature)
    if _tp_size() == 1:
        logp = torch.log_softmax(z, dim=-1)
        return -(logp.exp() * logp).sum(-1)
    # forward: sum over TP ranks; backward: identity (every rank holds the same loss;
    # torch.distributed.nn's all_reduce would sum the gradient again, x tp)
    from megatron.core.tensor_parallel import (
        reduce_from_tensor_model_parallel_region as all_reduce,
    )

    group = _tp_group()
    z_max = z.detach().amax(-1, keepdim=True)
    torch.distributed.all_reduce(z_max, op=torch.distributed.ReduceOp.MAX, group=group)
    z = z - z_max
    exp_z = z.exp()
    sum_exp = all_reduce(exp_z.sum(-1))
    sum_pz = all_reduce((exp_z * z).sum(-1))
    # H = log sum exp(z) - E_p[z]
    return sum_exp.log() - sum_pz / sum_exp


def token_stats(logits: torch.Tensor, labels: torch.Tensor, temperature: float,
                entropy: bool, entropy_grad: bool = False):
    """(log-probs [n], entropy [n] or None) of [n, V/tp] logits: the two functions above, on
    GPUs at TP=1 as Triton kernels (token_stats_kernel.py) that read the bf16 logits once each
    way instead of a dozen fp32 passes over [n, V] (about a fifth of a 0.5B actor step).
    The entropy carries a gradient only with entropy_grad (an entropy bonus)."""
    if not (logits.is_cuda and _tp_size() == 1):
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
            ent = entropy_from_logits(logits, temperature) if entropy else None
        return log_probs_from_logits(logits, labels, temperature), ent
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    from tandem.models.token_stats_kernel import token_stats_triton

    return token_stats_triton(logits, labels, 1.0 / temperature, entropy, entropy_grad)


def gather_vocab(logits: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary logits on every TP rank ([..., V/tp] -> [..., V])."""
    if _tp_size() == 1:
        return logits
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    return gather_from_tensor_model_parallel_region(logits)
