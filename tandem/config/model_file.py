"""Checks and values that read the model's config.json (actor_rollout_ref.model.path).

The file is read and turned into a model shape by the model-family registry
(tandem/models/registry.py), the same code the services build the model with: an architecture
Tandem cannot load is a config error before anything starts, and attention heads and routed
experts come from that shape (else from the built-in shape, actor_rollout_ref.model.*). The MoE
router load-balancing loss is decided here from the file and megatron.override_transformer_config.
A bad model.path is reported by check_model; the other readers treat it as the built-in shape so
that they do not report it again.
"""
from __future__ import annotations

import os

from tandem.config.errors import ConfigError, check
from tandem.config.schema import MegatronConfig, ModelConfig, TandemConfig
from tandem.models import registry

# The override_transformer_config keys Tandem reads itself (the others: transformer_overrides.py).
LOAD_BALANCING_TYPES = ("none", "aux_loss")
OVERRIDE_KEYS = ("moe_router_load_balancing_type", "moe_aux_loss_coeff")


def hf_config(model: ModelConfig) -> dict | None:
    """model.path's config.json, or None for the built-in shape (a bad path is reported on its own)."""
    if model.path is None or not os.path.isfile(os.path.join(model.path, "config.json")):
        return None
    return registry.read_hf_config(model.path)


def _shape(hf: dict):
    """The model shape of a config.json; a file Tandem cannot load names model.path."""
    try:
        return registry.shape_from_hf_config(hf)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"actor_rollout_ref.model.path: {e}") from None


def num_experts(hf: dict | None) -> int:
    """Routed experts of the model a config.json describes (0: dense or the built-in shape)."""
    moe = _shape(hf).moe if hf else None
    return moe.num_experts if moe is not None else 0


def attention_heads(model: ModelConfig, hf: dict | None) -> tuple[int, int]:
    """(attention heads, key/value heads) of the built-in shape or of model.path's config.json."""
    if hf is None:
        return model.num_attention_heads, model.num_key_value_heads
    shape = _shape(hf)
    return shape.num_attention_heads, shape.num_key_value_heads


def check_model(cfg: TandemConfig) -> None:
    """model.path is a Hugging Face directory; the built-in shape holds a whole prompt + response."""
    model, d = cfg.actor_rollout_ref.model, cfg.data
    if model.path is not None:
        check(os.path.isfile(os.path.join(model.path, "config.json")), "actor_rollout_ref.model.path",
              f"{model.path!r} is not a Hugging Face model directory (no config.json)")
        _shape(hf_config(model))  # an architecture or field Tandem cannot load
    else:
        need = d.max_prompt_length + d.max_response_length
        check(model.max_position_embeddings >= need, "actor_rollout_ref.model.max_position_embeddings",
              f"{model.max_position_embeddings} < data.max_prompt_length + data.max_response_length = {need}")


def check_moe(key: str, m: MegatronConfig, hf: dict | None) -> None:
    """Expert parallelism and the router load-balancing loss of one role's layout (`m`, at dotted
    `key`) against the model's experts (`hf`: hf_config(), None for the built-in dense shape)."""
    ep, tp = m.expert_model_parallel_size, m.tensor_model_parallel_size
    experts = num_experts(hf)
    over = m.override_transformer_config
    kind = over.get("moe_router_load_balancing_type")
    check(kind is None or kind in LOAD_BALANCING_TYPES,
          f"{key}.override_transformer_config.moe_router_load_balancing_type",
          f"{kind!r}; supported: {list(LOAD_BALANCING_TYPES)} (seq_aux_loss / global_aux_loss / sinkhorn "
          "are not: micro-batches are packed rows)")
    coeff = over.get("moe_aux_loss_coeff")
    check(coeff is None or (isinstance(coeff, (int, float)) and not isinstance(coeff, bool) and coeff >= 0),
          f"{key}.override_transformer_config.moe_aux_loss_coeff", f"{coeff!r} must be a number >= 0")
    if not experts:
        check(ep == 1, f"{key}.expert_model_parallel_size",
              f"{ep} needs a mixture-of-experts model (actor_rollout_ref.model.path with num_experts); "
              "this model is dense")
        check(kind in (None, "none") and not coeff, f"{key}.override_transformer_config",
              "a router load-balancing loss needs a mixture-of-experts model; this model is dense")
        return
    check(experts % ep == 0, f"{key}.expert_model_parallel_size",
          f"{ep} must divide num_experts={experts} (actor_rollout_ref.model.path config.json)")
    check(tp == 1 or m.sequence_parallel, f"{key}.sequence_parallel",
          f"must be true for a mixture-of-experts model at tensor_model_parallel_size={tp} "
          "(megatron-core trains MoE layers under TP only with sequence parallelism)")


def router_aux_loss_coeff(m: MegatronConfig, model: ModelConfig) -> float:
    """The MoE router load-balancing loss coefficient a role trains with (0.0: off).

    Like transformers, which adds router_aux_loss_coef x its loss only when config.json sets
    output_router_logits: on by default exactly then (verl's mbridge leaves it off for RL);
    override_transformer_config.moe_router_load_balancing_type (none | aux_loss) and
    .moe_aux_loss_coeff (default: router_aux_loss_coef, else 0.001) decide otherwise."""
    hf = hf_config(model)
    if not num_experts(hf):
        return 0.0
    over = m.override_transformer_config
    coeff = float(over.get("moe_aux_loss_coeff", hf.get("router_aux_loss_coef", 0.001)))
    kind = over.get("moe_router_load_balancing_type")
    if kind is None:
        kind = "aux_loss" if ("moe_aux_loss_coeff" in over or hf.get("output_router_logits")) else "none"
    return coeff if kind == "aux_loss" else 0.0
