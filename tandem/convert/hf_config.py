"""HF config.json <-> ModelShape for LlamaForCausalLM, Qwen2ForCausalLM and (moe_config.py)
Qwen3MoeForCausalLM.

Refuses (ValueError naming the field) anything the megatron local spec used here cannot
express: other architectures, rope scaling, head_dim != hidden/heads, non-SiLU activations,
Llama's attention_bias (it also biases o_proj) / mlp_bias, Qwen2 sliding-window attention.
Reads rope_theta from either the v4 top-level field or v5's `rope_parameters`.
"""
from __future__ import annotations

from tandem.models.spec import ModelShape

KNOWN_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                       "Qwen3MoeForCausalLM": "qwen3_moe"}


def _as_dict(config) -> dict:
    return dict(config) if isinstance(config, dict) else config.to_dict()


def _refuse(field: str, value, why: str):
    raise ValueError(f"unsupported HF config: {field}={value!r} ({why}); "
                     f"known architectures: {sorted(KNOWN_ARCHITECTURES)}")


def architecture_of(config) -> str:
    c = _as_dict(config)
    archs = c.get("architectures") or []
    if len(archs) != 1 or archs[0] not in KNOWN_ARCHITECTURES:
        _refuse("architectures", archs, "exactly one known architecture expected")
    return archs[0]


def _rope(c: dict) -> float:
    params = c.get("rope_parameters") or {}
    spec = c.get("rope_scaling") or params  # transformers v4 vs v5 spelling
    rope_type = spec.get("rope_type", spec.get("type", "default"))
    if rope_type != "default":
        _refuse("rope_parameters.rope_type", rope_type, "only plain RoPE is supported")
    theta = c.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        _refuse("rope_theta", None, "missing")
    if float(theta) != int(theta):
        # build.py passes int(shape.rope_theta) as megatron's rotary_base.
        _refuse("rope_theta", theta, "must be an integer value")
    return float(theta)


def shape_from_hf_config(config) -> ModelShape:
    """dict or transformers.PretrainedConfig -> ModelShape."""
    c = _as_dict(config)
    arch = architecture_of(c)
    if arch == "Qwen3MoeForCausalLM":
        from tandem.convert.moe_config import qwen3_moe_shape

        return qwen3_moe_shape(c, _refuse, _rope(c))
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim")
    if head_dim is not None and head_dim * heads != hidden:
        _refuse("head_dim", head_dim, f"must equal hidden_size/num_attention_heads = {hidden // heads}")
    act = c.get("hidden_act", "silu")
    if act != "silu":
        _refuse("hidden_act", act, "only silu (SwiGLU) is supported")
    if arch == "LlamaForCausalLM":
        if c.get("attention_bias", False):
            _refuse("attention_bias", True, "Llama's attention_bias also biases o_proj; not supported")
        if c.get("mlp_bias", False):
            _refuse("mlp_bias", True, "MLP biases are not supported")
        attention_bias = False
    else:  # Qwen2: q/k/v always carry a bias, o_proj never
        if c.get("use_sliding_window", False):
            _refuse("use_sliding_window", True, "sliding-window attention is not supported")
        attention_bias = True
    return ModelShape(
        vocab_size=c["vocab_size"],
        hidden_size=hidden,
        num_hidden_layers=c["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=c.get("num_key_value_heads") or heads,
        intermediate_size=c["intermediate_size"],
        max_position_embeddings=c["max_position_embeddings"],
        rope_theta=_rope(c),
        rms_norm_eps=c["rms_norm_eps"],
        attention_bias=attention_bias,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
    )


def hf_config_from_shape(shape: ModelShape, architecture: str, dtype: str = "float32") -> dict:
    """ModelShape -> a config.json dict that transformers loads as `architecture`."""
    if architecture not in KNOWN_ARCHITECTURES:
        _refuse("architecture", architecture, "cannot export")
    if (architecture == "Qwen3MoeForCausalLM") != (shape.moe is not None):
        _refuse("architecture", architecture, f"does not match the model (experts: {shape.moe is not None})")
    own_head_dim = shape.kv_channels * shape.num_attention_heads != shape.hidden_size
    if shape.moe is None and (shape.qk_layernorm or own_head_dim):
        _refuse("architecture", architecture, "Llama/Qwen2 have no q/k norms and head_dim = hidden/heads")
    if architecture == "LlamaForCausalLM" and shape.attention_bias:
        _refuse("attention_bias", True, "Llama has no qkv-only bias; export as Qwen2ForCausalLM")
    if architecture == "Qwen2ForCausalLM" and not shape.attention_bias:
        _refuse("attention_bias", False, "Qwen2 always has a qkv bias")
    config = {
        "architectures": [architecture],
        "model_type": KNOWN_ARCHITECTURES[architecture],
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.kv_channels,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": shape.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
        "rms_norm_eps": shape.rms_norm_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": shape.tie_word_embeddings,
        "dtype": dtype,
        "torch_dtype": dtype,
    }
    if architecture == "LlamaForCausalLM":
        config.update(attention_bias=False, mlp_bias=False)
    elif architecture == "Qwen3MoeForCausalLM":
        from tandem.convert.moe_config import qwen3_moe_config

        config.update(qwen3_moe_config(shape))
    else:
        config.update(use_sliding_window=False)
    return config
