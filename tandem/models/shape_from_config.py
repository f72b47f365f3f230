"""The run's model config section (+ tokenizer size) -> ModelShape, shared by every role that
builds a model.

With `model.path` (a Hugging Face directory) the shape comes from its config.json and
the `model.*` shape keys are ignored; otherwise the built-in shape keys are used. The section
is duck-typed (tandem.config.ModelConfig's fields): tandem.config imports tandem.models, not
the other way round.
"""
from __future__ import annotations

from tandem.models.registry import read_hf_config, shape_from_hf_config
from tandem.models.spec import ModelShape


def padded_vocab_size(tokenizer_len: int, multiple: int = 16) -> int:
    """Vocabulary rounded up so it splits evenly over tensor-parallel ranks."""
    return -(-tokenizer_len // multiple) * multiple


def model_shape(cfg, tokenizer_len: int) -> ModelShape:
    """cfg: tandem.config.ModelConfig (path, hidden_size, num_hidden_layers, ...)."""
    if cfg.path:
        shape = shape_from_hf_config(read_hf_config(cfg.path))  # existence checked by config.validate
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
