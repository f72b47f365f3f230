"""Qwen3MoeForCausalLM: routed experts, per-head q/k RMSNorms, head_dim of its own.

config.json: head_dim (may differ from hidden/heads), num_experts (v5 also spells it
num_local_experts), num_experts_per_tok, moe_intermediate_size, norm_topk_prob, and which
layers have experts: layer i is MoE iff i is not in mlp_only_layers and
(i + 1) % decoder_sparse_step == 0 (transformers' rule); the others are dense SwiGLU MLPs of
intermediate_size. Refused (ValueError naming the key): attention_bias (it also biases
o_proj), sliding windows, no MoE layer at all, non-SiLU activations, rope scaling.
router_aux_loss_coef / output_router_logits (the load-balancing loss in training) are not part
of the shape: tandem.config.router_aux_loss_coeff reads them.

Weights: the decoder table's attention, norms, embedding and head, plus Qwen3's q/k norms;
each layer's MLP is either dense (the decoder table's) or MoE:

    model.layers.L.mlp.gate.weight [E, h]                 <-> decoder.layers.L.mlp.router.weight
    model.layers.L.mlp.experts.e.{gate,up}_proj.weight    <-> ...mlp.experts.local_experts.i.linear_fc1.weight
    model.layers.L.mlp.experts.e.down_proj.weight         <-> ...mlp.experts.local_experts.i.linear_fc2.weight

megatron's SequentialMLP gives expert-parallel rank r the experts e = r * E/ep + i,
i < E/ep (contiguous blocks), so an EP rank's table lists only its own experts; expert weights
are split over the expert-tensor-parallel group (group="etp"), the router is replicated.
"""
from __future__ import annotations

from tandem.models.families._common import (
    base_config,
    check_experts,
    check_no_sliding_window,
    check_silu,
    decoder_fields,
    decoder_table,
    is_dense_mlp,
    is_per_layer,
    rope_theta,
)
from tandem.models.mapping import Direct, GatedMLP, Mapping, at_layer
from tandem.models.registry import Family, refuse
from tandem.models.spec import ModelShape, MoEShape

ARCHITECTURE = "Qwen3MoeForCausalLM"


def moe_layers_of(c: dict, num_layers: int) -> tuple[int, ...]:
    step = c.get("decoder_sparse_step", 1) or 1
    dense = set(c.get("mlp_only_layers") or [])
    return tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


def shape_from_config(c: dict) -> ModelShape:
    theta = rope_theta(c)
    if c.get("attention_bias", False):
        refuse("attention_bias", True, "Qwen3's attention_bias also biases o_proj; not supported")
    check_no_sliding_window(c)
    check_silu(c)
    num_experts = c.get("num_experts", c.get("num_local_experts"))
    if not num_experts or num_experts < 1:
        refuse("num_experts", num_experts, "a Qwen3-MoE model needs experts")
    layers = c["num_hidden_layers"]
    moe_layers = moe_layers_of(c, layers)
    if not moe_layers:
        refuse("mlp_only_layers", c.get("mlp_only_layers"), "no layer has experts (with decoder_sparse_step="
               f"{c.get('decoder_sparse_step', 1)}); load it as a dense model instead")
    bad = [i for i in c.get("mlp_only_layers") or [] if not 0 <= i < layers]
    if bad:
        refuse("mlp_only_layers", bad, f"layer indices must be in 0..{layers - 1}")
    return ModelShape(
        **decoder_fields(c, theta),
        attention_bias=False,
        head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
        qk_layernorm=True,
        moe=MoEShape(num_experts=num_experts, top_k=c["num_experts_per_tok"],
                     moe_intermediate_size=c["moe_intermediate_size"],
                     norm_topk_prob=bool(c.get("norm_topk_prob", False)), moe_layers=moe_layers),
    )


def check_shape(shape: ModelShape) -> None:
    check_experts(shape, ARCHITECTURE, True)


def config_from_shape(shape: ModelShape, dtype: str) -> dict:
    moe = shape.moe
    return dict(
        base_config(shape, ARCHITECTURE, "qwen3_moe", dtype),
        num_experts=moe.num_experts,
        num_experts_per_tok=moe.top_k,
        moe_intermediate_size=moe.moe_intermediate_size,
        norm_topk_prob=moe.norm_topk_prob,
        # step 1 + the complement of moe_layers expresses any layer pattern
        decoder_sparse_step=1,
        mlp_only_layers=[i for i in range(shape.num_hidden_layers) if i not in moe.moe_layers],
        attention_bias=False,
        use_sliding_window=False,
    )


def _expert_mappings(layer: int, local: int, expert: int) -> list[Mapping]:
    hl = f"model.layers.{layer}.mlp.experts.{expert}."
    ml = f"decoder.layers.{layer}.mlp.experts.local_experts.{local}."
    return [GatedMLP(ml + "linear_fc1.weight", hl + "gate_proj.weight", hl + "up_proj.weight", group="etp"),
            Direct(ml + "linear_fc2.weight", hl + "down_proj.weight", 1, group="etp")]


def mappings(shape: ModelShape, ep_rank: int, ep_size: int) -> list[Mapping]:
    """Every concrete mapping of EP rank `ep_rank` (layer-major; experts in local order)."""
    moe = shape.moe
    if moe.num_experts % ep_size:
        raise ValueError(f"num_experts={moe.num_experts} is not divisible by expert_model_parallel_size={ep_size}")
    local_count = moe.num_experts // ep_size
    hl, ml = "model.layers.{layer}.", "decoder.layers.{layer}."
    table = decoder_table(shape)
    per_layer = [m for m in table if is_per_layer(m) and not is_dense_mlp(m)]
    per_layer += [Direct(ml + "self_attention.q_layernorm.weight", hl + "self_attn.q_norm.weight"),
                  Direct(ml + "self_attention.k_layernorm.weight", hl + "self_attn.k_norm.weight")]
    dense_mlp = [m for m in table if is_dense_mlp(m)]
    out = [m for m in table if not is_per_layer(m)]
    for layer in range(shape.num_hidden_layers):
        out += [at_layer(m, layer) for m in per_layer]
        if layer not in moe.moe_layers:
            out += [at_layer(m, layer) for m in dense_mlp]
            continue
        out.append(Direct(f"decoder.layers.{layer}.mlp.router.weight", f"model.layers.{layer}.mlp.gate.weight"))
        for i in range(local_count):
            out += _expert_mappings(layer, i, ep_rank * local_count + i)
    return out


FAMILY = Family(ARCHITECTURE, shape_from_config, check_shape, config_from_shape, mappings)
