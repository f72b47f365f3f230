"""HF config.json <-> ModelShape for Qwen3MoeForCausalLM (routed experts, q/k norms).

Read: head_dim (may differ from hidden/heads), num_experts (v5 also spells it
num_local_experts), num_experts_per_tok, moe_intermediate_size, norm_topk_prob, and which
layers have experts: layer i is MoE iff i is not in mlp_only_layers and
(i + 1) % decoder_sparse_step == 0 (transformers' rule); the others are dense SwiGLU MLPs of
intermediate_size. Refused (ValueError naming the key): attention_bias (it also biases
o_proj), sliding windows, no MoE layer at all, non-SiLU activations, rope scaling.
router_aux_loss_coef / output_router_logits (the load-balancing loss in training) are not part
of the shape: tandem.config.router_aux_loss_coeff reads them.
"""
from __future__ import annotations

from tandem.models.spec import ModelShape, MoEShape

ARCHITECTURE = "Qwen3MoeForCausalLM"


def moe_layers_of(c: dict, num_layers: int) -> tuple[int, ...]:
    step = c.get("decoder_sparse_step", 1) or 1
    dense = set(c.get("mlp_only_layers") or [])
    return tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


def qwen3_moe_shape(c: dict, refuse, rope_theta: float) -> ModelShape:
    """config dict -> ModelShape; `refuse(field, value, why)` raises (hf_config's message format)."""
    if c.get("attention_bias", False):
        refuse("attention_bias", True, "Qwen3's attention_bias also biases o_proj; not supported")
    if c.get("use_sliding_window", False):
        refuse("use_sliding_window", True, "sliding-window attention is not supported")
    if c.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", c["hidden_act"], "only silu (SwiGLU) is supported")
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
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    return ModelShape(
        vocab_size=c["vocab_size"],
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=c.get("num_key_value_heads") or heads,
        intermediate_size=c["intermediate_size"],
        max_position_embeddings=c["max_position_embeddings"],
        rope_theta=rope_theta,
        rms_norm_eps=c["rms_norm_eps"],
        attention_bias=False,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        head_dim=c.get("head_dim") or hidden // heads,
        qk_layernorm=True,
        moe=MoEShape(num_experts=num_experts, top_k=c["num_experts_per_tok"],
                     moe_intermediate_size=c["moe_intermediate_size"],
                     norm_topk_prob=bool(c.get("norm_topk_prob", False)), moe_layers=moe_layers),
    )


def qwen3_moe_config(shape: ModelShape) -> dict:
    """The Qwen3-MoE-specific config.json fields of `shape` (hf_config adds the common ones)."""
    moe = shape.moe
    return {
        "model_type": "qwen3_moe",
        "head_dim": shape.kv_channels,
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k,
        "moe_intermediate_size": moe.moe_intermediate_size,
        "norm_topk_prob": moe.norm_topk_prob,
        # step 1 + the complement of moe_layers expresses any layer pattern
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i in range(shape.num_hidden_layers) if i not in moe.moe_layers],
        "attention_bias": False,
        "use_sliding_window": False,
    }
