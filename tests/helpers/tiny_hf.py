"""Tiny random Hugging Face checkpoints built locally with transformers (nothing downloaded),
shared by the unit, multi-rank and e2e tests (tests/helpers is on sys.path through tests/conftest.py)."""
import pathlib

import torch

DENSE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
             intermediate_size=128, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1)
MOE = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
           max_position_embeddings=64, rms_norm_eps=1e-6, initializer_range=0.1)

# Qwen3-MoE variants the conversion tests cover: "topk_norm" (norm_topk_prob, head_dim != hidden/heads,
# every layer MoE) and "plain" (softmax-then-top-k without renormalising, tied embeddings, layer 0 dense)
MOE_VARIANTS = {"topk_norm": dict(head_dim=32, norm_topk_prob=True, tie_word_embeddings=False),
                "plain": dict(norm_topk_prob=False, tie_word_embeddings=True, mlp_only_layers=[0])}


def _save(model, path) -> pathlib.Path:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)  # nonzero: a wrong bias layout must show
            elif "norm" in name:
                p.uniform_(0.5, 1.5)  # non-unit norms: a swapped norm must show
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0, 1.0)  # peaked router: a wrong expert choice must show
    model.save_pretrained(str(path), safe_serialization=True)
    return pathlib.Path(path)


def tiny_llama(path, seed: int = 0, **overrides) -> pathlib.Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return _save(LlamaForCausalLM(LlamaConfig(**{**DENSE, "tie_word_embeddings": False, **overrides})), path)


def tiny_qwen2(path, seed: int = 1, **overrides) -> pathlib.Path:
    """Qwen2-0.5B style: qkv bias, tied embeddings."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return _save(Qwen2ForCausalLM(Qwen2Config(**{**DENSE, "tie_word_embeddings": True, **overrides})), path)


def tiny_qwen3_moe(path, seed: int = 0, **overrides) -> pathlib.Path:
    """Qwen3-MoE: 4 experts, top 2; overrides e.g. head_dim, norm_topk_prob, mlp_only_layers."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    return _save(Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**MOE, **overrides})), path)


def tiny_qwen3(path, seed: int = 2, **overrides) -> pathlib.Path:
    """Qwen3 dense (0.6B style): q/k norms, head_dim != hidden/heads, tied embeddings."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return _save(Qwen3ForCausalLM(Qwen3Config(**{**DENSE, "head_dim": 32, "tie_word_embeddings": True,
                                                 **overrides})), path)


def tiny_mistral(path, seed: int = 3, **overrides) -> pathlib.Path:
    """Mistral (v0.3 style: no sliding window), head_dim != hidden/heads as in Mistral-Nemo."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    return _save(MistralForCausalLM(MistralConfig(**{**DENSE, "head_dim": 8, "sliding_window": None,
                                                     "tie_word_embeddings": False, **overrides})), path)


def tiny_reward_model(path, family: str = "llama", seed: int = 2, **overrides) -> pathlib.Path:
    """A one-label XForSequenceClassification (a reward model): Llama, or Qwen2 (qkv bias, tied
    embeddings in the config, which a classifier does not use). pad_token_id 0 (transformers reads
    the score at the last token that is not it). Its score head is scaled up so scores differ
    visibly between rows."""
    from transformers import (
        LlamaConfig,
        LlamaForSequenceClassification,
        Qwen2Config,
        Qwen2ForSequenceClassification,
    )

    config_cls, model_cls, tied = {"llama": (LlamaConfig, LlamaForSequenceClassification, False),
                                   "qwen2": (Qwen2Config, Qwen2ForSequenceClassification, True)}[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**DENSE, "tie_word_embeddings": tied, "num_labels": 1, "pad_token_id": 0,
                                    **overrides}))
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)
    return _save(model, path)
