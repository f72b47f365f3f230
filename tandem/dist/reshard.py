"""Training TP layout -> TP=1 layout: the weights a generation engine at TP=1 (or a
standalone rollout) loads, gathered over the TP group on the device.

Each parameter's TP shards are all-gathered (NCCL on GPUs), then re-laid out through the
same typed mappings that import Hugging Face checkpoints (tandem/convert/mapping.py): a
plain concatenation is wrong for linear_fc1 ([gate_r; up_r] per rank) and must follow
the per-group interleave of linear_qkv. Every TP rank gets the full weights.
"""
from __future__ import annotations

import torch

from tandem.convert.mapping import Direct, expand_mappings


def gather_shards(t: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's `t` in rank order (just [t] without a group or in a group of one)."""
    if group is None or torch.distributed.get_world_size(group) == 1:
        return [t]
    t = t.contiguous()
    out = [torch.empty_like(t) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(out, t, group=group)
    return out


def tp1_weights(model, shape, tp_group=None) -> dict[str, torch.Tensor]:
    """{megatron name: tensor in the TP=1 layout} on this rank's device (collective over TP).
    Pipeline parallelism and MoE are not handled (their weights span other groups)."""
    from megatron.core import parallel_state

    if getattr(shape, "moe", None) is not None:
        raise ValueError("TP=1 weight sync: MoE models are not supported yet")
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        raise ValueError("TP=1 weight sync: pipeline_model_parallel_size > 1 is not supported")
    group = tp_group if tp_group is not None else parallel_state.get_tensor_model_parallel_group()
    params = dict(model.named_parameters())
    out = {}
    for m in expand_mappings(shape):
        local = params[m.megatron].detach()
        shards = gather_shards(local, None if isinstance(m, Direct) and m.split_dim is None else group)
        out[m.megatron] = shards[0] if len(shards) == 1 else m.shard(m.unshard(shards), 0, 1)
    return out
