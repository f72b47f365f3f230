"""Training layout -> TP=1 (and EP=1) layout: the weights a generation engine at TP=1 (or a
standalone rollout) loads, gathered on the device.

Split parameters are gathered in buckets: every rank flattens its shards of many parameters
into one buffer, one all-gather per bucket brings every rank's buffer (NCCL on GPUs), and
each parameter's TP=1 tensor is assembled from views of the result (one copy). A plain
concatenation is right for the row-split tensors (embedding, head, linear_qkv: TP slices whole
query groups), not for linear_fc1 ([gate_r; up_r] per rank) or the column-split ones; the
typed mappings (tandem/models/mapping.py) say which is which. Replicated tensors (norms,
routers) are returned as they are. Routed experts (MoE) are gathered over the expert-TP group,
then every expert-parallel rank's experts over the EP group, and named by their global index.
`bucket_bytes=0` keeps the former path (one all-gather per parameter; bench/weight_sync.py
compares the two). Every TP rank gets the full weights; at EP > 1 every rank of the EP group.
The way back (`shard_pairs`: a TP=1 tensor -> one TP rank's shard, as views) is what a
standalone rollout at TP > 1 uses on received weights. (megatron-core's own resharding,
megatron.core.resharding, plans sends and receives between two models of ONE torch.distributed
world; actor and rollout services are two worlds, so it does not fit between them.)
"""
from __future__ import annotations

import torch

from tandem.models.mapping import QKV, Direct, GatedMLP, Mapping
from tandem.models.registry import weight_mappings

BUCKET_BYTES = 1 << 30  # per all-gather (before gathering): fewer collectives vs. peak memory


def expert_ranks() -> tuple[int, int, int, int]:
    """(ep_rank, ep_size, etp_rank, etp_size) of this process; (0, 1, 0, 1) without megatron groups."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 1, 0, 1
    return (ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size(),
            ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size())


def gather_shards(t: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's `t` in rank order (just [t] without a group or in a group of one)."""
    if group is None or torch.distributed.get_world_size(group) == 1:
        return [t]
    t = t.contiguous()
    out = [torch.empty_like(t) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(out, t, group=group)
    return out


def _all_gather_flat(out: torch.Tensor, flat: torch.Tensor, group) -> None:
    gather = getattr(torch.distributed, "all_gather_single", None) or torch.distributed.all_gather_into_tensor
    gather(out, flat, group=group)


def gather_shards_bucketed(tensors: list[torch.Tensor], group, bucket_bytes: int) -> list[list[torch.Tensor]]:
    """`gather_shards` of many same-dtype tensors with one all-gather per bucket of up to
    `bucket_bytes` (a larger tensor gets a bucket of its own): per tensor, every rank's copy
    as a view of the gathered buffer."""
    world = 1 if group is None else torch.distributed.get_world_size(group)
    if world == 1:
        return [[t] for t in tensors]
    out: list[list[torch.Tensor]] = []
    start = 0
    while start < len(tensors):
        end, size = start + 1, tensors[start].numel() * tensors[start].element_size()
        while end < len(tensors) and size + tensors[end].numel() * tensors[end].element_size() <= bucket_bytes:
            size += tensors[end].numel() * tensors[end].element_size()
            end += 1
        bucket = tensors[start:end]
        flat = torch.cat([t.reshape(-1) for t in bucket])
        gathered = torch.empty(world * flat.numel(), dtype=flat.dtype, device=flat.device)
        _all_gather_flat(gathered, flat, group)
        per_rank = gathered.view(world, flat.numel())
        offset = 0
        for t in bucket:
            out.append([per_rank[r, offset:offset + t.numel()].view(t.shape) for r in range(world)])
            offset += t.numel()
        start = end
    return out


def tp1_tensor(m: Mapping, shards: list[torch.Tensor]) -> torch.Tensor:
    """Every TP rank's megatron shard of `m` (rank order) -> the TP=1 megatron tensor; the same
    values as m.shard(m.unshard(shards), 0, 1) with one copy instead of two or three."""
    if len(shards) == 1:
        return shards[0]
    if isinstance(m, GatedMLP):  # rank r holds [gate_r; up_r]: TP=1 is [gate_0 .. gate_n; up_0 .. up_n]
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    if isinstance(m, QKV):  # whole query groups per rank, in order
        return torch.cat(shards, dim=0)
    if isinstance(m, Direct) and m.split_dim is not None:
        return torch.cat(shards, dim=m.split_dim)
    raise ValueError(f"{m.megatron}: no TP=1 layout for {type(m).__name__}")


def _replicated(m: Mapping) -> bool:
    return isinstance(m, Direct) and m.split_dim is None


def tp1_shape(m: Mapping, local_shape, tp: int) -> tuple[int, ...]:
    """The TP=1 shape of `m` from one TP rank's shard shape."""
    shape = list(local_shape)
    if tp > 1 and not _replicated(m):
        shape[m.split_dim if isinstance(m, Direct) else 0] *= tp
    return tuple(shape)


def shard_pairs(m: Mapping, full: torch.Tensor, param: torch.Tensor, tp_rank: int,
                tp: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The inverse of tp1_tensor as (destination, source) view pairs: copying each source into
    its destination fills `param`, TP rank `tp_rank`'s shard of m, from its TP=1 tensor `full`
    (no allocation; a standalone rollout at TP > 1 slices its shards from received weights)."""
    if tp == 1 or _replicated(m):
        return [(param, full)]
    if isinstance(m, GatedMLP):  # TP=1 [gate; up] -> rank r [gate_r; up_r]
        half = param.shape[0] // 2
        gate, up = full.chunk(2, dim=0)
        return [(param[:half], gate.chunk(tp, dim=0)[tp_rank]), (param[half:], up.chunk(tp, dim=0)[tp_rank])]
    if isinstance(m, QKV):  # whole query groups per rank, in order
        return [(param, full.chunk(tp, dim=0)[tp_rank])]
    if isinstance(m, Direct):
        return [(param, full.chunk(tp, dim=m.split_dim)[tp_rank])]
    raise ValueError(f"{m.megatron}: no TP shard of {type(m).__name__}")


def tp1_weights(model, shape, tp_group=None, bucket_bytes: int = BUCKET_BYTES) -> dict[str, torch.Tensor]:
    """{megatron name in the TP=1, EP=1, PP=1 layout: tensor} on this rank's device, in that
    layout's table order (collective over TP, over EP for a MoE model, and over the pipeline
    stages, which then exchange their layers: every rank gets the whole model)."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() > 1:
        weights = _across_stages(model, shape, tp_group, bucket_bytes)
    else:
        weights = _stage_tp1(model, shape, tp_group, bucket_bytes)
    missing = [m.megatron for m in weight_mappings(shape) if m.megatron not in weights]
    if missing:
        raise ValueError(f"TP=1 weight sync: no tensor for {missing[:5]}")
    return {m.megatron: weights[m.megatron] for m in weight_mappings(shape)}


def _stage_tp1(model, shape, tp_group, bucket_bytes: int) -> dict[str, torch.Tensor]:
    """tp1_weights of this pipeline stage's own parameters (local layer numbers)."""
    from megatron.core import parallel_state as ps

    groups = {"tp": tp_group if tp_group is not None else ps.get_tensor_model_parallel_group(),
              "etp": ps.get_expert_tensor_parallel_group() if shape.moe is not None else None}
    ep_rank, ep_size, _, _ = expert_ranks()
    params = dict(model.named_parameters())
    mine = [m for m in weight_mappings(shape, ep_rank, ep_size) if m.megatron in params]  # this stage's
    local = {m.megatron: params[m.megatron].detach() for m in mine}
    full = {m.megatron: local[m.megatron] for m in mine if _replicated(m)}
    split = [m for m in mine if not _replicated(m)]
    for (group, dtype), ms in _by(split, lambda m: (m.group, local[m.megatron].dtype)).items():
        for m, shards in zip(ms, _gather([local[m.megatron] for m in ms], groups[group], bucket_bytes)):
            full[m.megatron] = tp1_tensor(m, shards)
    if ep_size > 1:
        full = _gather_experts(full, shape, ep_size, ps.get_expert_model_parallel_group(), bucket_bytes)
    return full


def _across_stages(model, shape, tp_group, bucket_bytes: int) -> dict[str, torch.Tensor]:
    """Each stage's TP=1 tensors, renamed to global layer numbers, broadcast from each stage
    to the others (one flat buffer per stage; a tied output layer on the last stage is the
    first stage's embedding, not sent twice)."""
    import dataclasses
    import re

    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    from megatron.core.utils import unwrap_model

    if shape.moe is not None:
        raise ValueError("TP=1 weight sync: a MoE model at pipeline_model_parallel_size > 1 is not supported")
    inner = unwrap_model(model)
    offset = get_transformer_layer_offset(inner.config)
    stage_shape = dataclasses.replace(shape, num_hidden_layers=len(inner.decoder.layers))
    local = {re.sub(r"^decoder\.layers\.(\d+)\.", lambda g: f"decoder.layers.{int(g.group(1)) + offset}.", k): v
             for k, v in _stage_tp1(inner, stage_shape, tp_group, bucket_bytes).items()}
    group = ps.get_pipeline_model_parallel_group()
    full: dict[str, torch.Tensor] = {}
    for stage, src in enumerate(dist.get_process_group_ranks(group)):
        mine = stage == ps.get_pipeline_model_parallel_rank()
        meta = [[(k, tuple(v.shape), v.dtype) for k, v in local.items()] if mine else None]
        dist.broadcast_object_list(meta, src=src, group=group)
        names = meta[0]
        if len({dtype for _, _, dtype in names}) != 1:
            raise ValueError(f"TP=1 weight sync: stage {stage} holds several dtypes")
        flat = (torch.cat([v.reshape(-1) for v in local.values()]) if mine else
                torch.empty(sum(torch.Size(s).numel() for _, s, _ in names), dtype=names[0][2],
                            device=next(inner.parameters()).device))
        dist.broadcast(flat, src=src, group=group)
        start = 0
        for name, size, _ in names:
            n = torch.Size(size).numel()
            full.setdefault(name, flat[start:start + n].view(size))
            start += n
    return full


def _by(items, key) -> dict:
    out: dict = {}
    for it in items:
        out.setdefault(key(it), []).append(it)
    return out


def _gather(tensors: list[torch.Tensor], group, bucket_bytes: int) -> list[list[torch.Tensor]]:
    if bucket_bytes > 0:
        return gather_shards_bucketed(tensors, group, bucket_bytes)
    return [gather_shards(t, group) for t in tensors]


def _gather_experts(full: dict, shape, ep_size: int, ep_group, bucket_bytes: int) -> dict:
    """This EP rank's experts (TP=1 layout, local names) -> every EP rank's, by global name.
    Entry j of rank r's table holds the same tensor kind as entry j of every other rank's."""
    ep_rank = expert_ranks()[0]
    tables = [weight_mappings(shape, r, ep_size) for r in range(ep_size)]
    global_name = {m.hf_names[0]: m.megatron for m in weight_mappings(shape)}
    experts = [j for j, m in enumerate(tables[ep_rank]) if m.group == "etp"]
    out = {k: v for k, v in full.items() if k not in {tables[ep_rank][j].megatron for j in experts}}
    for dtype, js in _by(experts, lambda j: full[tables[ep_rank][j].megatron].dtype).items():
        gathered = _gather([full[tables[ep_rank][j].megatron] for j in js], ep_group, bucket_bytes)
        for j, per_rank in zip(js, gathered):
            for r, t in enumerate(per_rank):
                out[global_name[tables[r][j].hf_names[0]]] = t
    return out
