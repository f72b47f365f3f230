"""Qwen3ForCausalLM (dense): Llama's layout plus an RMSNorm on each query and key head before RoPE,
and a head_dim of its own (Qwen3-0.6B: 16 heads x 128 = 2048 != hidden 1024).

Weights: the decoder table (no biases) plus, per layer,

    model.layers.L.self_attn.q_norm.weight [head_dim] <-> decoder.layers.L.self_attention.q_layernorm.weight
    model.layers.L.self_attn.k_norm.weight [head_dim] <-> decoder.layers.L.self_attention.k_layernorm.weight

(replicated over TP: every rank's heads share one norm). Refused (ValueError naming the field):
attention_bias (Qwen3's also biases o_proj), sliding-window attention, rope scaling, non-SiLU
activations.
"""
from __future__ import annotations

from tandem.models.families._common import (
    base_config,
    check_experts,
    check_no_sliding_window,
    check_silu,
    decoder_fields,
    decoder_table,
    rope_theta,
)
from tandem.models.mapping import Direct, Mapping, expand
from tandem.models.registry import Family, refuse
from tandem.models.spec import ModelShape

ARCHITECTURE = "Qwen3ForCausalLM"


def shape_from_config(c: dict) -> ModelShape:
    theta = rope_theta(c)
    if c.get("attention_bias", False):
        refuse("attention_bias", True, "Qwen3's attention_bias also biases o_proj; not supported")
    check_no_sliding_window(c)
    check_silu(c)
    return ModelShape(**decoder_fields(c, theta), attention_bias=False,
                      head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"], qk_layernorm=True)


def check_shape(shape: ModelShape) -> None:
    check_experts(shape, ARCHITECTURE, False)
    if not shape.qk_layernorm or shape.attention_bias:
        refuse("architecture", ARCHITECTURE, "Qwen3 has q/k norms and no qkv bias")


def config_from_shape(shape: ModelShape, dtype: str) -> dict:
    return dict(base_config(shape, ARCHITECTURE, "qwen3", dtype), attention_bias=False, use_sliding_window=False)


def mappings(shape: ModelShape, ep_rank: int, ep_size: int) -> list[Mapping]:
    hl, ml = "model.layers.{layer}.", "decoder.layers.{layer}."
    table = decoder_table(shape) + [
        Direct(ml + "self_attention.q_layernorm.weight", hl + "self_attn.q_norm.weight"),
        Direct(ml + "self_attention.k_layernorm.weight", hl + "self_attn.k_norm.weight")]
    return expand(table, shape.num_hidden_layers)


FAMILY = Family(ARCHITECTURE, shape_from_config, check_shape, config_from_shape, mappings)
