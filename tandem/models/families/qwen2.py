"""Qwen2ForCausalLM: Llama's layout with a bias on q/k/v (never on o_proj); its table is the
decoder table, whose qkv bias rows a Qwen2 shape always has.

Refused (ValueError naming the field): rope scaling, head_dim != hidden/heads, non-SiLU
activations, sliding-window attention.
"""
from __future__ import annotations

from tandem.models.families._common import (
    base_config,
    check_dense_config,
    check_dense_shape,
    check_no_sliding_window,
    dense_mappings,
    dense_shape,
)
from tandem.models.registry import Family, refuse
from tandem.models.spec import ModelShape

ARCHITECTURE = "Qwen2ForCausalLM"


def shape_from_config(c: dict) -> ModelShape:
    check_dense_config(c)
    check_no_sliding_window(c)
    return dense_shape(c, attention_bias=True)


def check_shape(shape: ModelShape) -> None:
    check_dense_shape(shape, ARCHITECTURE)
    if not shape.attention_bias:
        refuse("attention_bias", False, "Qwen2 always has a qkv bias")


def config_from_shape(shape: ModelShape, dtype: str) -> dict:
    return dict(base_config(shape, ARCHITECTURE, "qwen2", dtype), use_sliding_window=False)


FAMILY = Family(ARCHITECTURE, shape_from_config, check_shape, config_from_shape, dense_mappings)
