"""ModelConfig (+ tokenizer size) -> ModelShape, shared by every role that builds a model."""
from __future__ import annotations

from tandem.config import ModelConfig
from tandem.models.spec import ModelShape


def padded_vocab_size(tokenizer_len: int, multiple: int = 16) -> int:
    """Vocabulary rounded up so it splits evenly over tensor-parallel ranks."""
    return -(-tokenizer_len // multiple) * multiple


def model_shape(cfg: ModelConfig, tokenizer_len: int) -> ModelShape:
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
