"""Model shape (a Llama/Qwen2/Qwen3-MoE-family decoder) and its megatron TransformerConfig."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class MoEShape:
    """Routed experts (Qwen3-MoE style: no shared expert, softmax router, top-k)."""
    num_experts: int
    top_k: int
    moe_intermediate_size: int
    norm_topk_prob: bool  # renormalise the top-k probabilities to sum to 1
    moe_layers: tuple[int, ...]  # global layer indices with experts; the rest are dense MLPs

    def __post_init__(self):
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"top_k={self.top_k} must be in 1..num_experts={self.num_experts}")


@dataclass
class ModelShape:
    """Decoder shape; names follow Hugging Face's config.json where they exist."""
    vocab_size: int = 32
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False  # qkv bias (Qwen2: True)
    tie_word_embeddings: bool = False
    init_std: float = 0.02
    head_dim: int | None = None  # None: hidden_size / num_attention_heads (Qwen3 sets its own)
    qk_layernorm: bool = False  # RMSNorm on each q and k head before RoPE (Qwen3)
    moe: MoEShape | None = None

    @property
    def kv_channels(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def __post_init__(self):
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not divisible by "
                             f"num_key_value_heads={self.num_key_value_heads}")


def moe_config(moe: MoEShape | None, num_layers: int, ep: int) -> dict:
    """TransformerConfig MoE fields, chosen so the forward equals Hugging Face's Qwen3-MoE block.

    Router: HF takes softmax over all experts, then top-k, then (norm_topk_prob) divides by the
    top-k sum. megatron's pre-softmax=False takes top-k of the logits and softmaxes those k: the
    same experts (softmax is monotonic) and the same weights (softmax(x)_S / sum_S softmax(x)
    = softmax(x_S)), up to rounding. pre-softmax=True is softmax, top-k, no division
    (norm_topk_prob=false). No capacity factor (no token dropping). megatron's own load-balancing
    and z losses stay off (they leave the forward unchanged): the router load-balancing loss,
    when a run enables it, is attached by tandem/train/moe_aux_loss.py, scaled to Tandem's
    loss units.
    """
    if moe is None:
        if ep > 1:
            raise ValueError(f"expert_model_parallel_size={ep} needs a model with experts")
        return {}
    if moe.num_experts % ep:
        raise ValueError(f"num_experts={moe.num_experts} is not divisible by expert_model_parallel_size={ep}")
    if moe.top_k == 1 and moe.norm_topk_prob:
        # HF's weight is then the constant 1; megatron refuses top-1 without pre-softmax
        raise ValueError("num_experts_per_tok=1 with norm_topk_prob=true is not supported")
    return dict(
        num_moe_experts=moe.num_experts,
        moe_router_topk=moe.top_k,
        moe_ffn_hidden_size=moe.moe_intermediate_size,
        moe_router_pre_softmax=not moe.norm_topk_prob,
        moe_router_score_function="softmax",
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_expert_capacity_factor=None,
        moe_grouped_gemm=False,
        moe_layer_freq=[int(i in moe.moe_layers) for i in range(num_layers)],
        expert_model_parallel_size=ep,
    )


def transformer_config(shape: ModelShape, *, tp: int = 1, pp: int = 1, ep: int = 1, cp: int = 1,
                       params_dtype: torch.dtype = torch.float32, sequence_parallel: bool = False,
                       fused: bool = False, overrides: dict | None = None):
    """fused: megatron's torch.compile'd SwiGLU and bias-dropout-add (one kernel each way
    instead of several); GPUs only, where compilation pays for itself. overrides: TransformerConfig
    fields a role's config passes through (tandem/config/transformer_overrides.py), over these."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**{**dict(
        num_layers=shape.num_hidden_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_key_value_heads,
        ffn_hidden_size=shape.intermediate_size,
        kv_channels=shape.kv_channels,
        qk_layernorm=shape.qk_layernorm,
        normalization="RMSNorm",
        layernorm_epsilon=shape.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.attention_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=shape.init_std,
        bias_activation_fusion=fused,
        bias_dropout_fusion=fused,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,  # the sequence split lives in Tandem's attention (models/context_parallel.py)
        sequence_parallel=sequence_parallel,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        # CPU init of the full weight, then TP split: the same seed gives the same model at any TP.
        use_cpu_initialization=True,
        # Losses are sums over a micro-batch's loss units (tokens or rows); DDP sums gradients over
        # DP ranks and finalize_model_grads divides by the mini-batch's units: any split, same step.
        calculate_per_token_loss=True,
        variable_seq_lengths=pp > 1,  # micro-batches differ in length; PP sends shapes first
        # megatron 0.19 refuses variable lengths with its default allgather dispatcher; alltoall
        # runs on NCCL and on gloo (torch >= 2.x has all_to_all_single with uneven splits).
        moe_token_dispatcher_type="alltoall",
        **moe_config(shape.moe, shape.num_hidden_layers, ep),
    ), **(overrides or {})})
