"""Core attention for megatron-core layer specs, on torch's scaled_dot_product_attention.

megatron-core's local `DotProductAttention` materialises the [b, np, sq, sk] scores and
needs the CUDA RNG tracker; SDPA picks flash / memory-efficient kernels on GPUs and
runs on CPU. Transformer Engine and flash-attn stay optional.

Mask convention is megatron's: `attention_mask` is a bool tensor broadcastable to
[b, 1, sq, sk] where True means "do not attend". None means: causal when the mask type
is causal and sq == sk (training, prefill without padding), else attend everywhere
(single-token decode against a cache).

Packed batches (megatron's THD format, tandem/models/packing.py): q, k, v come as
[t, heads, d] with cu_seqlens; attention is causal within each sequence. On GPUs this is
torch's varlen flash attention (fp16 / bf16; shared-prompt packings: two calls merged,
tandem/models/shared_prompt_attention.py); elsewhere one causal SDPA over the
sequences right-padded to the longest (one call per layer: a call per sequence made the CPU
path's training steps ~2-3x slower). At context parallelism > 1: masked SDPA per local chunk over
the keys and values gathered from every CP rank (tandem/models/context_parallel.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide

from tandem.models import context_parallel
from tandem.models.shared_prompt_attention import shared_prompt_attention
from tandem.models.shared_prompts import segment_mask


class SDPAttention(MegatronModule):
    """Drop-in `core_attention` module: [sq, b, np, hn] x 3 -> [sq, b, np * hn]."""

    def __init__(self, config: TransformerConfig, layer_number: int,
                 attn_mask_type: AttnMaskType, attention_type: str = "self",
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None, **kwargs):
        super().__init__(config=config)
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
        if attention_bias is not None:
            raise ValueError("SDPAttention does not support attention bias")
        if packed_seq_params is not None:
            if packed_seq_params.qkv_format != "thd":
                raise ValueError(f"SDPAttention: packed format {packed_seq_params.qkv_format!r} (only 'thd')")
            return self._packed(query, key, value, packed_seq_params)
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        sq, sk = query.shape[0], key.shape[0]
        # [s, b, h, d] -> [b, h, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        kw = dict(dropout_p=self.dropout_p if self.training else 0.0, scale=self.softmax_scale,
                  enable_gqa=self.heads_per_partition != self.groups_per_partition)
        # a branch, not is_causal=(...): under torch.compile sq == sk is symbolic and SDPA takes a bool
        if attention_mask is None and mask_type == AttnMaskType.causal and sq == sk:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
        else:
            sdpa_mask = None if attention_mask is None else ~attention_mask  # SDPA: True = attend
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, **kw)
        # [b, np, sq, hn] -> [sq, b, np * hn]
        return out.permute(2, 0, 1, 3).reshape(sq, out.shape[0], -1)

    def _packed(self, q, k, v, params):
        """[t, np, hn] x 3, causal within each sequence of cu_seqlens -> [t, np * hn]."""
        gqa = self.heads_per_partition != self.groups_per_partition
        split = getattr(params, "tandem_cp", None)  # context parallelism (tandem/models/context_parallel.py)
        if split is not None:
            return context_parallel.attention(q, k, v, split, self.softmax_scale, gqa).reshape(q.shape[0], -1)
        segments = getattr(params, "tandem_segments", None)  # shared prompts (tandem/models/shared_prompts.py)
        flash = q.is_cuda and q.dtype in _FLASH_DTYPES and _varlen_attn is not None
        if flash and segments is None:
            out = _varlen_attn(q, k, v, params.tandem_cu_seqlens, int(params.max_seqlen_q), self.softmax_scale)
        elif flash:  # two flash calls merged (tandem/models/shared_prompt_attention.py)
            out = shared_prompt_attention(q, k, v, params.tandem_shared, self.softmax_scale)
        else:  # one causal SDPA over the sequences right-padded to the longest: a sequence's
            # padding comes after its tokens, so causality alone keeps it out of their attention
            seq, pos = (i.to(q.device) for i in params.tandem_pad_index)
            shape = (len(params.tandem_cu_seqlens) - 1, int(params.max_seqlen_q))  # [sequences, longest]
            q, k, v = (t.new_zeros(*shape, *t.shape[1:]).index_put((seq, pos), t).transpose(1, 2)
                       for t in (q, k, v))  # -> [sequences, heads, longest, d]
            mask = {"is_causal": True} if segments is None else {"attn_mask": segment_mask(segments, shape, (seq, pos))}
            out = F.scaled_dot_product_attention(q, k, v, scale=self.softmax_scale, enable_gqa=gqa,
                                                 **mask).transpose(1, 2)[seq, pos]
        return out.reshape(out.shape[0], -1)


def _load_varlen():
    """Varlen flash attention: torch's `aten._flash_attention_forward` with cu_seqlens (GQA
    native; its backward is autograd's). Called directly rather than through
    `torch.nn.attention.varlen.varlen_attn`: that is a Python custom op (dispatch, logging and a
    zeros kernel on every call): ~0.28 ms of host time per layer call on an H200 under the
    profiler, in passes whose GPU waited for the host; inside compiled layers the aten op is
    one extern kernel call."""
    op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if op is None:
        return None

    def call(q, k, v, cu, max_len, scale):  # GQA: fewer key / value heads, as they are
        return op(q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale)[0]
    return call


def _expand_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[n, groups, d] -> [n, heads, d], each group repeated heads/groups times (as
    repeat_interleave, which syncs with the host on CUDA to size its output)."""
    n, groups, d = t.shape
    return t[:, :, None].expand(n, groups, heads // groups, d).reshape(n, heads, d)


_varlen_attn = _load_varlen()
_FLASH_DTYPES = (torch.float16, torch.bfloat16)  # flash attention's; fp32 on a GPU takes the padded SDPA
