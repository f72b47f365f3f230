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


def _all_gather(t: torch.Tensor, group) -> list[torch.Tensor]:
    size = torch.distributed.get_world_size(group)
    t = t.contiguous()
    out = [torch.empty_like(t) for _ in range(size)]
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
    tp = torch.distributed.get_world_size(group)
    params = dict(model.named_parameters())
    out = {}
    for m in expand_mappings(shape):
        local = params[m.megatron].detach()
        if tp == 1 or (isinstance(m, Direct) and m.split_dim is None):
            out[m.megatron] = local
        else:
            out[m.megatron] = m.shard(m.unshard(_all_gather(local, group)), 0, 1)
    return out
