"""What the families share: RoPE parsing, the common config.json checks and fields, the
decoder name table (embedding, attention, norms, dense SwiGLU MLP, head) that Llama uses as it
is and Qwen2 / Qwen3-MoE reuse, and the sequence-classification variant of a causal family.

Not a family (the registry skips `_*` modules). Refusals go through registry.refuse, so every
message has one format and names the known architectures.
"""
from __future__ import annotations

from tandem.models.mapping import LAYER, QKV, Direct, GatedMLP, Mapping, expand
from tandem.models.registry import Family, refuse
from tandem.models.spec import ModelShape

# ---- config.json -> ModelShape ------------------------------------------------------------


def rope_theta(c: dict) -> float:
    """Plain RoPE's base, from either the v4 top-level field or v5's `rope_parameters`."""
    params = c.get("rope_parameters") or {}
    spec = c.get("rope_scaling") or params  # transformers v4 vs v5 spelling
    rope_type = spec.get("rope_type", spec.get("type", "default"))
    if rope_type != "default":
        refuse("rope_parameters.rope_type", rope_type, "only plain RoPE is supported")
    theta = c.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        refuse("rope_theta", None, "missing")
    if float(theta) != int(theta):
        # build.py passes int(shape.rope_theta) as megatron's rotary_base.
        refuse("rope_theta", theta, "must be an integer value")
    return float(theta)


def check_dense_config(c: dict) -> None:
    """Llama / Qwen2: head_dim = hidden/heads (the spec derives it), SwiGLU."""
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim")
    if head_dim is not None and head_dim * heads != hidden:
        refuse("head_dim", head_dim, f"must equal hidden_size/num_attention_heads = {hidden // heads}")
    check_silu(c)


def check_silu(c: dict) -> None:
    act = c.get("hidden_act", "silu")
    if act != "silu":
        refuse("hidden_act", act, "only silu (SwiGLU) is supported")


def check_no_sliding_window(c: dict) -> None:
    if c.get("use_sliding_window", False):
        refuse("use_sliding_window", True, "sliding-window attention is not supported")


def decoder_fields(c: dict, theta: float) -> dict:
    """The ModelShape fields every family reads the same way (the rest are the family's)."""
    heads = c["num_attention_heads"]
    return dict(
        vocab_size=c["vocab_size"],
        hidden_size=c["hidden_size"],
        num_hidden_layers=c["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=c.get("num_key_value_heads") or heads,
        intermediate_size=c["intermediate_size"],
        max_position_embeddings=c["max_position_embeddings"],
        rope_theta=theta,
        rms_norm_eps=c["rms_norm_eps"],
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
    )


def dense_shape(c: dict, attention_bias: bool) -> ModelShape:
    """Llama / Qwen2: the shape, once the family's checks passed (RoPE is checked here)."""
    return ModelShape(**decoder_fields(c, rope_theta(c)), attention_bias=attention_bias)


# ---- ModelShape -> config.json ------------------------------------------------------------


def check_experts(shape: ModelShape, architecture: str, has_experts: bool) -> None:
    if has_experts != (shape.moe is not None):
        refuse("architecture", architecture, f"does not match the model (experts: {shape.moe is not None})")


def check_dense_shape(shape: ModelShape, architecture: str) -> None:
    """Llama / Qwen2: no experts, no q/k norms, head_dim = hidden/heads."""
    check_experts(shape, architecture, False)
    if shape.qk_layernorm or shape.kv_channels * shape.num_attention_heads != shape.hidden_size:
        refuse("architecture", architecture, "Llama/Qwen2 have no q/k norms and head_dim = hidden/heads")


def base_config(shape: ModelShape, architecture: str, model_type: str, dtype: str) -> dict:
    """The config.json fields every family writes (a family adds or overrides its own after)."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
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


# ---- weight names ---------------------------------------------------------------------------


def decoder_table(shape: ModelShape) -> list[Mapping]:
    """Llama's table (megatron local spec names, `{layer}` wildcards); the qkv bias rows when
    the shape has one (Qwen2)."""
    d = shape.kv_channels
    attn = dict(num_heads=shape.num_attention_heads, num_groups=shape.num_key_value_heads, head_dim=d)
    hl, ml = "model.layers.{layer}.", "decoder.layers.{layer}."
    table: list[Mapping] = [
        Direct("embedding.word_embeddings.weight", "model.embed_tokens.weight", 0),
        Direct(ml + "input_layernorm.weight", hl + "input_layernorm.weight"),
        QKV(ml + "self_attention.linear_qkv.weight", hl + "self_attn.q_proj.weight",
            hl + "self_attn.k_proj.weight", hl + "self_attn.v_proj.weight", **attn),
        Direct(ml + "self_attention.linear_proj.weight", hl + "self_attn.o_proj.weight", 1),
        Direct(ml + "pre_mlp_layernorm.weight", hl + "post_attention_layernorm.weight"),
        GatedMLP(ml + "mlp.linear_fc1.weight", hl + "mlp.gate_proj.weight", hl + "mlp.up_proj.weight"),
        Direct(ml + "mlp.linear_fc2.weight", hl + "mlp.down_proj.weight", 1),
        Direct("decoder.final_layernorm.weight", "model.norm.weight"),
    ]
    if shape.attention_bias:
        table.append(QKV(ml + "self_attention.linear_qkv.bias", hl + "self_attn.q_proj.bias",
                         hl + "self_attn.k_proj.bias", hl + "self_attn.v_proj.bias", **attn))
    if not shape.tie_word_embeddings:
        table.append(Direct("output_layer.weight", "lm_head.weight", 0))
    return table


def is_dense_mlp(m: Mapping) -> bool:
    return ".mlp.linear_fc" in m.megatron


def is_per_layer(m: Mapping) -> bool:
    return LAYER in m.megatron


def dense_mappings(shape: ModelShape, ep_rank: int, ep_size: int) -> list[Mapping]:
    """A dense family's concrete table: the decoder table at every layer (no experts, so the
    same on every expert-parallel rank)."""
    return expand(decoder_table(shape), shape.num_hidden_layers)


# ---- sequence classification (reward models) ----------------------------------------------


def num_labels(c: dict) -> int:
    """transformers' num_labels: len(id2label) when the file has it, else num_labels (default 2)."""
    labels = c.get("id2label")
    return len(labels) if labels else int(c.get("num_labels", 2))


def sequence_classification(causal: Family) -> Family:
    """`XForSequenceClassification` of a causal family: the same trunk, config.json and checks,
    one label, and the causal table minus `lm_head` plus `score.weight` (the scalar head,
    replicated over TP). Loaded only (reward models): never chosen or written as an export target."""
    architecture = causal.architecture.replace("ForCausalLM", "ForSequenceClassification")
    score = Direct("output_layer.weight", "score.weight")

    def shape_from_config(c: dict) -> ModelShape:
        if num_labels(c) != 1:
            refuse("num_labels", num_labels(c), "a reward model has one label (a scalar score)")
        return causal.shape_from_config(c)

    def check_shape(shape: ModelShape) -> None:
        refuse("architecture", architecture, "sequence-classification models are loaded, not exported")

    def mappings(shape: ModelShape, ep_rank: int, ep_size: int) -> list[Mapping]:
        trunk = [m for m in causal.mappings(shape, ep_rank, ep_size) if m.megatron != "output_layer.weight"]
        return [*trunk, score]

    return Family(architecture, shape_from_config, check_shape, causal.config_from_shape, mappings, head="scalar")
