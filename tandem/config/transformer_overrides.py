"""megatron.override_transformer_config: which megatron-core TransformerConfig fields Tandem passes
through, which it reads itself, and why it refuses the others.

verl passes any TransformerConfig field through. Tandem builds megatron-core's local layer spec
(torch norms and linears, SDPA / flash core attention; no Transformer Engine, Apex or DeepEP), so:

- PASSED fields go to TransformerConfig as given (megatron-core validates their combination when
  the model is built): activation recomputation, the compiled bias fusions, the router's dtype;
- READ_BY_TANDEM fields (the MoE router load-balancing loss) are Tandem's (model_file.py);
- DEFAULT_ONLY fields are accepted at the value Tandem runs with and refused otherwise, naming why
  (most need a kernel library that is not part of Tandem);
- any other field is refused: a model's shape comes from its config.json.
"""
from __future__ import annotations

from typing import Any, Callable

from tandem.config.errors import raise_all
from tandem.config.schema import MegatronConfig

RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "layernorm", "shared_experts")  # moe_act: grouped GEMM only


def _choice(*values) -> Callable[[Any], bool]:
    return lambda v: v in values


def _count(v) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)


def _flag(v) -> bool:
    return isinstance(v, bool)


def _modules(v) -> bool:
    return isinstance(v, list) and all(m in RECOMPUTE_MODULES for m in v)


# field -> (accepted values, in words; a test of a value)
PASSED: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "recompute_granularity": ("null, full or selective", _choice(None, "full", "selective")),
    "recompute_method": ("null, uniform or block", _choice(None, "uniform", "block")),
    "recompute_num_layers": ("null or a whole number >= 1", _count),
    "recompute_modules": (f"a list of {', '.join(RECOMPUTE_MODULES)}", _modules),
    "bias_activation_fusion": ("true or false", _flag),
    "bias_dropout_fusion": ("true or false", _flag),
    "deallocate_pipeline_outputs": ("true or false", _flag),
    "moe_router_dtype": ("null, fp32 or fp64", _choice(None, "fp32", "fp64")),
}
READ_BY_TANDEM = ("moe_router_load_balancing_type", "moe_aux_loss_coeff")
NO_FUSED_KERNELS = "needs fused kernels from Transformer Engine or Apex, which Tandem does not use"
UNEVEN_PP = "uneven pipeline stages are not offered: the layers split evenly over pipeline_model_parallel_size"
# field -> (values Tandem runs with, why others are refused)
DEFAULT_ONLY: dict[str, tuple[tuple, str]] = {
    "attention_backend": ((), "mapped separately (verl_keys.py)"),
    "apply_rope_fusion": ((False,), f"{NO_FUSED_KERNELS}; Tandem applies RoPE itself (tandem/models/rope_table.py)"),
    "masked_softmax_fusion": ((False,), f"{NO_FUSED_KERNELS}; attention is SDPA or flash attention, with no "
                                        "separate softmax"),
    "gradient_accumulation_fusion": ((False,), f"{NO_FUSED_KERNELS} (fused weight-gradient GEMMs)"),
    "persist_layer_norm": ((False,), f"{NO_FUSED_KERNELS} (Apex's persistent layer norm); the norms are torch's"),
    "moe_grouped_gemm": ((False,), "needs Transformer Engine's grouped GEMM; experts run as megatron's SequentialMLP"),
    "moe_permute_fusion": ((False,), f"{NO_FUSED_KERNELS} (Transformer Engine's fused token permutation)"),
    "moe_enable_deepep": ((False,), "DeepEP is not part of Tandem; experts exchange tokens with the all-to-all "
                                    "dispatcher"),
    "moe_token_dispatcher_type": (("alltoall",), "Tandem's dispatcher is alltoall: flex needs DeepEP, and "
                                                 "allgather refuses micro-batches of varying lengths"),
    "moe_shared_expert_overlap": ((False,), "overlapping shared experts with the dispatch is not offered"),
    "moe_z_loss_coeff": ((None, 0, 0.0), "the router's z-loss is not offered (its load-balancing loss is: "
                                         "moe_aux_loss_coeff)"),
    "num_layers_in_first_pipeline_stage": ((None,), UNEVEN_PP),
    "num_layers_in_last_pipeline_stage": ((None,), UNEVEN_PP),
    "account_for_embedding_in_pipeline_split": ((False,), UNEVEN_PP),
    "account_for_loss_in_pipeline_split": ((False,), UNEVEN_PP),
    "enable_vision_context_parallelism": ((False,), "vision models and context parallelism are not offered"),
}


def check_transformer_overrides(key: str, m: MegatronConfig) -> None:
    """`{key}.override_transformer_config` (key: a role's megatron section) holds only fields Tandem
    passes through or reads, at values it can run, and others only at the values it runs with; every
    field that does not is a problem of its own."""
    problems = []
    for name, value in m.override_transformer_config.items():
        field_key = f"{key}.override_transformer_config.{name}"
        if name in PASSED:
            words, ok = PASSED[name]
            if not ok(value):
                problems.append(f"{field_key}: {value!r}; accepted: {words}")
        elif name in DEFAULT_ONLY:
            accepted, why = DEFAULT_ONLY[name]
            if name != "attention_backend" and not any(
                    value == a and isinstance(value, bool) == isinstance(a, bool) for a in accepted):
                problems.append(f"{field_key}: {value!r}: {why}")
        elif name not in READ_BY_TANDEM:
            problems.append(f"{field_key}: not passed to megatron-core by Tandem: the model's shape comes from its "
                            f"config.json; passed through: {', '.join(PASSED)}; read by Tandem: "
                            f"{', '.join(READ_BY_TANDEM)}")
    problems += _recompute_problems(f"{key}.override_transformer_config", m.override_transformer_config)
    raise_all(problems)


def _recompute_problems(key: str, over: dict) -> list[str]:
    """megatron-core's rules for recomputation's fields together (its TransformerConfig would refuse
    them when the service builds the model; here they are found before anything starts)."""
    granularity = over.get("recompute_granularity")
    if granularity == "full" and (over.get("recompute_method") is None or over.get("recompute_num_layers") is None):
        return [f"{key}.recompute_granularity: full needs recompute_method (uniform or block) and "
                "recompute_num_layers (>= 1, at most the layers of one pipeline stage)"]
    if granularity == "selective" and over.get("recompute_num_layers") is not None:
        return [f"{key}.recompute_num_layers: must be null with recompute_granularity=selective (which recomputes "
                "recompute_modules in every layer)"]
    return []


def passed_overrides(m: MegatronConfig) -> dict[str, Any]:
    """The TransformerConfig fields a role's model is built with from its override_transformer_config."""
    return {k: v for k, v in m.override_transformer_config.items() if k in PASSED}
