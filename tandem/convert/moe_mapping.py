"""The HF <-> megatron name table for Qwen3-MoE, with routed experts split over EP ranks.

Attention, norms, embeddings and head are the Llama table's (mapping.py) plus Qwen3's per-head
q/k RMSNorms. Each layer's MLP is either dense (mapping.py's GatedMLP / Direct) or MoE:

    model.layers.L.mlp.gate.weight [E, h]                 <-> decoder.layers.L.mlp.router.weight
    model.layers.L.mlp.experts.e.{gate,up}_proj.weight    <-> ...mlp.experts.local_experts.i.linear_fc1.weight
    model.layers.L.mlp.experts.e.down_proj.weight         <-> ...mlp.experts.local_experts.i.linear_fc2.weight

megatron's SequentialMLP gives expert-parallel rank r the experts e = r * E/ep + i,
i < E/ep (contiguous blocks), so an EP rank's table lists only its own experts; expert weights
are split over the expert-tensor-parallel group (group="etp"), the router is replicated.
"""
from __future__ import annotations

from tandem.convert.mapping import (
    LAYER,
    Direct,
    GatedMLP,
    Mapping,
    _expand,
    llama_family_mappings,
)


def _is_dense_mlp(m: Mapping) -> bool:
    return ".mlp.linear_fc" in m.megatron


def _expert_mappings(layer: int, local: int, expert: int) -> list[Mapping]:
    hl = f"model.layers.{layer}.mlp.experts.{expert}."
    ml = f"decoder.layers.{layer}.mlp.experts.local_experts.{local}."
    return [GatedMLP(ml + "linear_fc1.weight", hl + "gate_proj.weight", hl + "up_proj.weight", group="etp"),
            Direct(ml + "linear_fc2.weight", hl + "down_proj.weight", 1, group="etp")]


def moe_mappings(shape, ep_rank: int, ep_size: int) -> list[Mapping]:
    """Every concrete mapping of EP rank `ep_rank` (layer-major; experts in local order)."""
    moe = shape.moe
    if moe.num_experts % ep_size:
        raise ValueError(f"num_experts={moe.num_experts} is not divisible by expert_model_parallel_size={ep_size}")
    local_count = moe.num_experts // ep_size
    hl, ml = "model.layers.{layer}.", "decoder.layers.{layer}."
    per_layer = [m for m in llama_family_mappings(shape) if LAYER in m.megatron and not _is_dense_mlp(m)]
    per_layer += [Direct(ml + "self_attention.q_layernorm.weight", hl + "self_attn.q_norm.weight"),
                  Direct(ml + "self_attention.k_layernorm.weight", hl + "self_attn.k_norm.weight")]
    dense_mlp = [m for m in llama_family_mappings(shape) if _is_dense_mlp(m)]
    out = [m for m in llama_family_mappings(shape) if LAYER not in m.megatron]
    for layer in range(shape.num_hidden_layers):
        out += [_expand(m, layer) for m in per_layer]
        if layer not in moe.moe_layers:
            out += [_expand(m, layer) for m in dense_mlp]
            continue
        out.append(Direct(f"decoder.layers.{layer}.mlp.router.weight", f"model.layers.{layer}.mlp.gate.weight"))
        for i in range(local_count):
            out += _expert_mappings(layer, i, ep_rank * local_count + i)
    return out


def other_ranks_hf_names(shape, ep_rank: int, ep_size: int) -> set[str]:
    """HF expert keys that other EP ranks load (skipped here, not unexpected)."""
    if shape.moe is None:
        return set()
    return {name for r in range(ep_size) if r != ep_rank
            for m in moe_mappings(shape, r, ep_size) if m.group == "etp" for name in m.hf_names}


def expert_ranks() -> tuple[int, int, int, int]:
    """(ep_rank, ep_size, etp_rank, etp_size) of this process; (0, 1, 0, 1) without megatron groups."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 1, 0, 1
    return (ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size(),
            ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size())
