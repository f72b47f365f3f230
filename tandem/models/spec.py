"""Model shape (a Llama/Qwen2-family decoder) and its megatron TransformerConfig."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


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

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not divisible by "
                             f"num_key_value_heads={self.num_key_value_heads}")


def transformer_config(shape: ModelShape, *, tp: int = 1, pp: int = 1,
                       params_dtype: torch.dtype = torch.float32, sequence_parallel: bool = False):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=shape.num_hidden_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_key_value_heads,
        ffn_hidden_size=shape.intermediate_size,
        kv_channels=shape.hidden_size // shape.num_attention_heads,
        normalization="RMSNorm",
        layernorm_epsilon=shape.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.attention_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=shape.init_std,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
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
        # (no MoE here; megatron 0.19 refuses variable lengths with its default allgather dispatcher)
        moe_token_dispatcher_type="alltoall",
    )
