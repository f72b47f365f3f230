"""ModelConfig (+ tokenizer size) -> ModelShape, shared by every role that builds a model.

With `model.path` (a Hugging Face directory) the shape comes from its config.json and
the `model.*` shape keys are ignored; otherwise the built-in shape keys are used.
"""
from __future__ import annotations

import json
import os

from tandem.config import ModelConfig
from tandem.models.spec import ModelShape


def padded_vocab_size(tokenizer_len: int, multiple: int = 16) -> int:
    """Vocabulary rounded up so it splits evenly over tensor-parallel ranks."""
    return -(-tokenizer_len // multiple) * multiple


def model_shape(cfg: ModelConfig, tokenizer_len: int) -> ModelShape:
    if cfg.path:
        from tandem.convert.hf_config import shape_from_hf_config

        with open(os.path.join(cfg.path, "config.json")) as f:  # existence checked by config.validate
            shape = shape_from_hf_config(json.load(f))
        if shape.vocab_size < tokenizer_len:
            raise ValueError(f"actor_rollout_ref.model.path: the model's vocab_size {shape.vocab_size} "
                             f"is smaller than the tokenizer's {tokenizer_len} tokens")
        return shape
    return ModelShape(
        vocab_size=padded_vocab_size(tokenizer_len),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        init_std=cfg.init_std,
    )
