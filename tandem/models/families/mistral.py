"""MistralForCausalLM: Llama's layout (no biases) with a head_dim of its own (Mistral-Nemo: 32 heads
x 128 != hidden 5120); its table is the decoder table.

Refused (ValueError naming the field): a sliding window shorter than the context (Mistral-7B-v0.1's
4096 of 32768; v0.2 / v0.3 set none), rope scaling, non-SiLU activations.
"""
from __future__ import annotations

from tandem.models.families._common import (
    base_config,
    check_experts,
    check_silu,
    decoder_fields,
    dense_mappings,
    rope_theta,
)
from tandem.models.registry import Family, refuse
from tandem.models.spec import ModelShape

ARCHITECTURE = "MistralForCausalLM"


def shape_from_config(c: dict) -> ModelShape:
    theta = rope_theta(c)
    window = c.get("sliding_window")
    if window is not None and window < c["max_position_embeddings"]:
        refuse("sliding_window", window, "sliding-window attention is not supported (only a window of at least "
               f"max_position_embeddings={c['max_position_embeddings']}, which is full attention)")
    check_silu(c)
    return ModelShape(**decoder_fields(c, theta), attention_bias=False,
                      head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


def check_shape(shape: ModelShape) -> None:
    check_experts(shape, ARCHITECTURE, False)
    if shape.qk_layernorm or shape.attention_bias:
        refuse("architecture", ARCHITECTURE, "Mistral has no q/k norms and no biases")


def config_from_shape(shape: ModelShape, dtype: str) -> dict:
    return dict(base_config(shape, ARCHITECTURE, "mistral", dtype), sliding_window=None)


FAMILY = Family(ARCHITECTURE, shape_from_config, check_shape, config_from_shape, dense_mappings)
