"""Varlen flash attention for shared-prompt packings (tandem/models/shared_prompts.py).

A group packs as [prompt | response 1 | ... | response n]: a prompt token sees the prompt's
earlier tokens, a response token the whole prompt and its own response's earlier tokens. No
single flash call has that mask, so it is two, over disjoint key sets, merged by their
log-sum-exps (as ring attention merges its blocks):

1. every segment (the prompt, each response) causally over itself: one varlen call;
2. every response's tokens over its group's prompt keys, unmasked: one varlen call whose keys
   are the prompt's rows gathered once per response (key / value heads are few: a small copy).

The backward is each call's flash backward given the merged output and log-sum-exp (then its
probabilities are the merged softmax's and its `D = rowsum(dO * O)` the merged one, so the two
gradients add up exactly), the second's query and key gradients added back where they were
gathered from. Flash's own autograd cannot do this: its log-sum-exp has no gradient.

The alternative, one padded SDPA with a dense [L, L] mask per group (the CPU path), runs
without flash kernels and materialises the mask; flex attention needs its own compilation per
block mask. Deliberately not here: the index arithmetic (`SharedPromptIndex.build`, from the
packing's per-row counts).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tandem.parallel.device import to_device


@dataclass
class SharedPromptIndex:
    """Where the two flash calls read: `cu_self` splits the packed tokens into segments (prompt,
    responses, filler); `query` are the response tokens that see a prompt, `key` their prompts'
    tokens (one copy per response), split by `cu_query` / `cu_key`."""

    cu_self: torch.Tensor  # int32 [segments + 1]
    max_self: int
    query: torch.Tensor  # long [m]: packed indices of response tokens, in packed order
    key: torch.Tensor  # long [k]: packed indices of each such response's prompt tokens
    cu_query: torch.Tensor  # int32 [responses + 1]
    cu_key: torch.Tensor  # int32 [responses + 1]
    max_query: int
    max_key: int

    @staticmethod
    def build(segment_lengths: list[int], response_starts: torch.Tensor, response_lengths: torch.Tensor,
              prompt_starts: torch.Tensor, prompt_lengths: torch.Tensor) -> SharedPromptIndex:
        """From the packed segments' lengths in order (zeros allowed) and, per response, where it
        and its prompt start in the packing and how long they are (CPU tensors)."""
        seg = [n for n in segment_lengths if n > 0]
        cu_self = torch.tensor([0, *seg], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        sees = (response_lengths > 0) & (prompt_lengths > 0)
        rs, rl, ps, pl = (x[sees].long() for x in (response_starts, response_lengths, prompt_starts, prompt_lengths))
        return SharedPromptIndex(
            cu_self, max(seg, default=0), _ranges(rs, rl), _ranges(ps, pl),
            torch.cat([rl.new_zeros(1), rl]).cumsum(0).int(), torch.cat([pl.new_zeros(1), pl]).cumsum(0).int(),
            int(rl.max()) if len(rl) else 0, int(pl.max()) if len(pl) else 0)

    def to(self, device: torch.device) -> SharedPromptIndex:
        # to_device: a plain copy from pageable memory would wait for the GPU's queued work
        move = {k: to_device(v, device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        return SharedPromptIndex(**move)


def _ranges(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """concat(arange(s, s + n) for s, n): one vectorised op."""
    first = torch.cumsum(lengths, 0) - lengths
    return torch.arange(int(lengths.sum())) - torch.repeat_interleave(first - starts, lengths)


def _flash_forward(q, k, v, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale: float):
    """-> (out [t, heads, d], log-sum-exp [heads, t] float32, rng state, unused)."""
    out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=scale)
    return out, lse, rng, unused


def _flash_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale: float,
                    rng, unused):
    """-> (dq, dk, dv) given the output and log-sum-exp the probabilities are taken against."""
    return torch.ops.aten._flash_attention_backward(
        dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0, causal, rng, unused, scale=scale)


class _SharedPromptFlash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_self, query, key, cu_query, cu_key, max_self, max_query, max_key, scale):
        out, lse, rng, unused = _flash_forward(q, k, v, cu_self, cu_self, max_self, max_self, True, scale)
        if len(query):
            cross, cross_lse, _, _ = _flash_forward(q[query], k[key], v[key], cu_query, cu_key, max_query, max_key,
                                                    False, scale)
            own_lse = lse[:, query]
            merged = torch.logaddexp(own_lse, cross_lse)
            w_own, w_cross = ((x - merged).exp().t()[:, :, None] for x in (own_lse, cross_lse))
            acc = merged.dtype  # flash's log-sum-exp: float32
            out = out.index_copy(0, query, (out[query].to(acc) * w_own + cross.to(acc) * w_cross).to(out.dtype))
            lse = lse.index_copy(1, query, merged)
        ctx.save_for_backward(q, k, v, out, lse, cu_self, query, key, cu_query, cu_key, rng, unused)
        ctx.sizes = (max_self, max_query, max_key, scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, cu_self, query, key, cu_query, cu_key, rng, unused = ctx.saved_tensors
        max_self, max_query, max_key, scale = ctx.sizes
        dout = dout.contiguous()
        dq, dk, dv = _flash_backward(dout, q, k, v, out, lse, cu_self, cu_self, max_self, max_self, True, scale,
                                     rng, unused)
        if len(query):
            cq, ck, cv = _flash_backward(dout[query], q[query], k[key], v[key], out[query],
                                         lse[:, query].contiguous(), cu_query, cu_key, max_query, max_key, False,
                                         scale, rng, unused)
            dq = dq.index_add(0, query, cq)
            dk = dk.index_add(0, key, ck)
            dv = dv.index_add(0, key, cv)
        return dq, dk, dv, *([None] * 9)


def shared_prompt_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: SharedPromptIndex,
                            scale: float) -> torch.Tensor:
    """[t, heads, d], [t, groups, d] x 2 (GQA: fewer key / value heads) -> [t, heads, d]."""
    return _SharedPromptFlash.apply(q, k, v, index.cu_self, index.query, index.key, index.cu_query, index.cu_key,
                                    index.max_self, index.max_query, index.max_key, scale)
