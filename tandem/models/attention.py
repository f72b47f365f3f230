"""Core attention for megatron-core layer specs, on torch's scaled_dot_product_attention.

megatron-core's local `DotProductAttention` materialises the [b, np, sq, sk] scores and
needs the CUDA RNG tracker; SDPA picks flash / memory-efficient kernels on GPUs and
runs on CPU. Transformer Engine and flash-attn stay optional.

Mask convention is megatron's: `attention_mask` is a bool tensor broadcastable to
[b, 1, sq, sk] where True means "do not attend". None means: causal when the mask type
is causal and sq == sk (training, prefill without padding), else attend everywhere
(single-token decode against a cache).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide


class SDPAttention(MegatronModule):
    """Drop-in `core_attention` module: [sq, b, np, hn] x 3 -> [sq, b, np * hn]."""

    def __init__(self, config: TransformerConfig, layer_number: int,
                 attn_mask_type: AttnMaskType, attention_type: str = "self",
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None, **kwargs):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention does not support context parallelism")
        if pg_collection is None:
            from megatron.core.process_groups_config import ProcessGroupCollection
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp = pg_collection.tp.size()
        self.attn_mask_type = attn_mask_type
        self.heads_per_partition = divide(config.num_attention_heads, tp)
        self.groups_per_partition = divide(config.num_query_groups, tp)
        head_dim = config.kv_channels
        self.softmax_scale = softmax_scale or config.softmax_scale or 1.0 / math.sqrt(head_dim)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None, **kwargs):
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPAttention supports neither packed sequences nor attention bias")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        sq, sk = query.shape[0], key.shape[0]
        # [s, b, h, d] -> [b, h, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        is_causal = attention_mask is None and mask_type == AttnMaskType.causal and sq == sk
        sdpa_mask = None if attention_mask is None else ~attention_mask  # SDPA: True = attend
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=sdpa_mask, is_causal=is_causal,
            dropout_p=self.dropout_p if self.training else 0.0, scale=self.softmax_scale,
            enable_gqa=self.heads_per_partition != self.groups_per_partition)
        # [b, np, sq, hn] -> [sq, b, np * hn]
        return out.permute(2, 0, 1, 3).reshape(sq, out.shape[0], -1)
