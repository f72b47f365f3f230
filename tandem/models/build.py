"""Build megatron-core GPTModels: the policy (LM head) and value models (scalar head, tandem/models/scalar_head.py)."""
from __future__ import annotations

import torch

from tandem.models.scalar_head import ScalarHead
from tandem.models.spec import ModelShape, transformer_config
from tandem.parallel import device

# megatron's compiled SwiGLU / bias-dropout-add fusions on GPUs (bench/actor_update_mfu.py
# turns them off to measure what they bring)
FUSE_ON_GPU = True


def layer_spec(moe: bool = False, qk_layernorm: bool = False):
    """megatron's local layer spec (SwiGLU MLP, or a MoE layer of SwiGLU experts) with SDPA core
    attention and an RMSNorm that supports sequence parallelism (also for Qwen3's q/k norms)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from tandem.models.attention import SDPAttention
    from tandem.models.norm import RMSNorm

    # moe_grouped_gemm=False: SequentialMLP, one local expert module each (names stay per expert).
    spec = get_gpt_layer_local_spec(num_experts=1 if moe else None, moe_grouped_gemm=False,
                                    qk_layernorm=qk_layernorm, normalization="RMSNorm")
    attention = spec.submodules.self_attention.submodules
    attention.core_attention = SDPAttention
    if qk_layernorm:
        attention.q_layernorm = RMSNorm
        attention.k_layernorm = RMSNorm
    spec.submodules.input_layernorm = RMSNorm
    spec.submodules.pre_mlp_layernorm = RMSNorm
    return spec


def block_spec(config, shape: ModelShape, pp_rank: int | None = None):
    """This pipeline stage's layers (dense or MoE per global layer index) plus the final norm.
    pp_rank: the stage (default: this rank's; a replica is stage 0 of 1)."""
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    from tandem.models.norm import RMSNorm

    moe_layers = set(shape.moe.moe_layers) if shape.moe else set()
    offset = get_transformer_layer_offset(config, pp_rank=pp_rank)
    specs = [layer_spec(moe=offset + i in moe_layers, qk_layernorm=shape.qk_layernorm)
             for i in range(get_num_layers_to_build(config, pp_rank=pp_rank))]
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=RMSNorm)


def _moe_without_te() -> None:
    """megatron-core 0.16 leaves moe_utils.te_general_gemm undefined without Transformer Engine
    (the router's gating linear then raises NameError); 0.19 sets it to None, as done here."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


_OWN_RANK = None


def _own_rank_groups():
    """megatron's process-group collection with every group this rank alone (a replica
    runs no collectives). Creating the groups is collective: every rank builds its replica."""
    import dataclasses

    import torch.distributed as dist
    from megatron.core.process_groups_config import ProcessGroupCollection

    global _OWN_RANK
    if _OWN_RANK is None:
        _OWN_RANK = dist.new_subgroups(group_size=1)[0]
    groups = ProcessGroupCollection()
    for f in dataclasses.fields(ProcessGroupCollection):
        # as megatron's defaults without context parallelism or all-gather-overlap groups
        none = f.name == "hcp" or f.name.endswith("_ag")
        setattr(groups, f.name, None if none else _OWN_RANK)
    return groups


def _no_init(weight: torch.Tensor) -> None:
    """megatron's init_method for weights that are overwritten before use."""


def build_gpt_model(shape: ModelShape, *, head: str = "lm", tp: int = 1, pp: int = 1, ep: int = 1,
                    params_dtype: torch.dtype = torch.float32, sequence_parallel: bool = False,
                    replica: bool = False, overrides: dict | None = None, weights_follow: bool = False):
    """A megatron-core GPTModel on this rank's device. head: "lm" or "scalar". replica: the
    whole model (TP = PP = EP = 1) on this rank alone, whatever the service's layout (the
    colocated rollout's TP=1 copy, tandem/rollout/replica.py). overrides: TransformerConfig fields
    from the role's megatron.override_transformer_config (activation recomputation, ...).
    weights_follow: every weight is written before use (a checkpoint, the policy's copy), so none is
    drawn at random and, on a GPU, none is made on the host first: at 7B the random draws on the
    host and the copy over were most of a service's start. megatron still sets each weight's
    tensor-parallel attributes (its init path runs, with an init that writes nothing)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    if head not in ("lm", "scalar"):
        raise ValueError(f"head must be 'lm' or 'scalar', got {head!r}")
    if shape.moe is not None:
        _moe_without_te()
    if replica and (tp, pp, ep, sequence_parallel) != (1, 1, 1, False):
        raise ValueError("a replica is the whole model: tp = pp = ep = 1, no sequence parallelism")
    if not replica and parallel_state.get_expert_model_parallel_world_size() != ep:
        raise ValueError(f"ep={ep} but megatron's expert-parallel group has "
                         f"{parallel_state.get_expert_model_parallel_world_size()} ranks (ParallelConfig.ep)")
    if weights_follow:
        overrides = {"init_method": _no_init, "output_layer_init_method": _no_init, "embedding_init_method": _no_init,
                     "use_cpu_initialization": not device.has_cuda(), **(overrides or {})}
    # context parallelism: the service's layout (parallel_state); a replica runs whole sequences
    cp = 1 if replica else parallel_state.get_context_parallel_world_size()
    config = transformer_config(shape, tp=tp, pp=pp, ep=ep, cp=cp, params_dtype=params_dtype,
                                sequence_parallel=sequence_parallel and tp > 1,
                                fused=FUSE_ON_GPU and device.has_cuda(), overrides=overrides)
    model = GPTModel(
        config=config,
        transformer_layer_spec=block_spec(config, shape, pp_rank=0 if replica else None),
        vocab_size=shape.vocab_size,
        max_sequence_length=shape.max_position_embeddings,
        pre_process=replica or parallel_state.is_pipeline_first_stage(),
        post_process=replica or parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=shape.tie_word_embeddings and head == "lm",
        position_embedding_type="rope",
        rotary_base=int(shape.rope_theta),
        **({"pg_collection": _own_rank_groups()} if replica else {}),
    )
    if head == "scalar" and model.post_process:
        model.output_layer = ScalarHead(shape.hidden_size, params_dtype, config.sequence_parallel)
    # The local spec's torch norms are created in fp32; megatron's mixed-precision optimizer
    # expects every parameter in params_dtype (as Megatron-LM's Float16Module casts them).
    for param in model.parameters():
        param.data = param.data.to(params_dtype)
    # Routed experts count as expert-parallel parameters at every EP (megatron marks them so
    # only at EP > 1): the optimizer is then the same chained dense + expert pair at any EP,
    # so its checkpoints reshard between EP sizes. At EP=1 their gradients are reduced over
    # the expert data-parallel group, which is the data-parallel group then.
    for name, param in model.named_parameters():
        if ".mlp.experts." in name:
            param.allreduce = False
    return model.to(device.device())
