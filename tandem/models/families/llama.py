"""LlamaForCausalLM: RMSNorm, SwiGLU, RoPE, GQA, no biases; its table is the decoder table.

Refused (ValueError naming the field): rope scaling, head_dim != hidden/heads, non-SiLU
activations, attention_bias (Llama's also biases o_proj), mlp_bias.
"""
from __future__ import annotations

from tandem.models.families._common import (
    base_config,
    check_dense_config,
    check_dense_shape,
    dense_mappings,
    dense_shape,
)
from tandem.models.registry import Family, refuse
from tandem.models.spec import ModelShape

ARCHITECTURE = "LlamaForCausalLM"


def shape_from_config(c: dict) -> ModelShape:
    check_dense_config(c)
    if c.get("attention_bias", False):
        refuse("attention_bias", True, "Llama's attention_bias also biases o_proj; not supported")
    if c.get("mlp_bias", False):
        refuse("mlp_bias", True, "MLP biases are not supported")
    return dense_shape(c, attention_bias=False)


def check_shape(shape: ModelShape) -> None:
    check_dense_shape(shape, ARCHITECTURE)
    if shape.attention_bias:
        refuse("attention_bias", True, "Llama has no qkv-only bias; export as Qwen2ForCausalLM")


def config_from_shape(shape: ModelShape, dtype: str) -> dict:
    return dict(base_config(shape, ARCHITECTURE, "llama", dtype), attention_bias=False, mlp_bias=False)


FAMILY = Family(ARCHITECTURE, shape_from_config, check_shape, config_from_shape, dense_mappings)
