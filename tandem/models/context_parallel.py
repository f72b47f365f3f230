"""Context parallelism (CP) for packed micro-batches: the sequence split over CP ranks.

A packed micro-batch (tandem/models/packing.py) of N tokens (N a multiple of 2 x CP) is cut into
2 x CP equal chunks and CP rank r takes chunks r and 2CP-1-r (the load-balanced "zig-zag" order
of megatron / Transformer Engine): under causal attention an early chunk is cheap and a late one
dear, so every rank gets one of each. The split is of the whole packed stream, not of each
sequence: the attention below masks by sequence, so any split is exact, and one long row (the
case CP is for) is balanced the same way.

Attention: each layer all-gathers the keys and values of every CP rank (backward: the gradient
summed over the ranks that read them, then each rank's own slice), and each local chunk attends
to the keys up to its end with a mask (same sequence, causal, shared-prompt segments). Chosen over
a ring exchange: exact and simple, one collective per layer instead of CP-1 overlapped steps; the
gathered keys and values (2 x N x groups x head_dim per layer, transient) are small next to the
activations kept for backward, which shrink by CP. A ring is for when that gather stops fitting.

Outputs: the last stage's output (logits at the kept positions, or values) is gathered over the
CP ranks back into the CP=1 order, so the readers (PackedOutput, the losses) run unchanged and
every CP rank computes the same loss; the gather's backward keeps this rank's own rows only, so
each rank back-propagates through its own tokens and megatron's DDP sums the gradients over
data x context ranks. The loss units are counted on CP rank 0 only (schedule.py).

Deliberately not here: which tokens are packed (packing.py), RoPE angles (packing.packed_rope
takes the local positions).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def cp_size() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_context_parallel_world_size() if parallel_state.model_parallel_is_initialized() else 1


class ContextSplit:
    """This CP rank's share of a packed stream of `total` tokens (a multiple of 2 x cp)."""

    def __init__(self, total: int, cp: int, rank: int, cu_seqlens: torch.Tensor, segments=None):
        if total % (2 * cp):
            raise ValueError(f"a packed micro-batch of {total} tokens cannot split into 2 x {cp} chunks")
        self.total, self.cp, self.rank = total, cp, rank
        self.chunk = total // (2 * cp)
        self.local_len = 2 * self.chunk
        chunks = torch.arange(2 * cp).view(2 * cp, 1) * self.chunk + torch.arange(self.chunk)
        owner_of_chunk = torch.cat([torch.arange(cp), torch.arange(cp).flip(0)])  # 0 1 .. cp-1 cp-1 .. 0
        # each rank's packed indices: its early chunk, then its late one
        self.locals = torch.stack([torch.cat([chunks[r], chunks[2 * cp - 1 - r]]) for r in range(cp)])
        self.local = self.locals[rank]
        self.owner = owner_of_chunk.repeat_interleave(self.chunk)  # [N] CP rank holding each packed token
        self.slot = torch.empty(total, dtype=torch.long)  # [N] its index on that rank
        self.slot[self.locals.reshape(-1)] = torch.arange(self.local_len).repeat(cp)
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        self.seq = torch.repeat_interleave(torch.arange(len(lens)), lens)  # [N] sequence of each token
        self.seq_start = cu_seqlens[:-1].long()[self.seq]  # [N] packed index where its sequence starts
        self.segments = segments  # [N] shared-prompt segments (0: prompt, k: k-th response) or None
        # the gathered [cp x local] rows in packed order
        self.order = self.owner * self.local_len + self.slot
        self._masks = {}  # every layer attends with the same masks: one copy, not one per layer

    def bounds(self) -> list[tuple[int, int]]:
        """This rank's chunks as packed-index ranges [a, b)."""
        return [(int(c * self.chunk), int((c + 1) * self.chunk)) for c in (self.rank, 2 * self.cp - 1 - self.rank)]

    def mask(self, a: int, b: int, like: torch.Tensor) -> tuple[int, torch.Tensor]:
        """(first key, [b-a, b-first] additive mask in like's dtype: 0 = attend, -inf = not) of the
        queries a..b-1 over keys first..b-1: same sequence, causal, and a response token sees its
        group's prompt and its own response only. Additive, not bool: SDPA would turn a bool mask into
        a float copy in every layer and keep each for backward (4x the bytes, times the layers)."""
        key = (a, b, like.device, like.dtype)
        if key in self._masks:
            return self._masks[key]
        first = int(self.seq_start[a])
        q, k = torch.arange(a, b), torch.arange(first, b)
        allowed = (self.seq[q][:, None] == self.seq[k][None]) & (k[None] <= q[:, None])
        if self.segments is not None:
            sq, sk = self.segments[q][:, None], self.segments[k][None]
            allowed &= (sk == 0) | (sk == sq)
        additive = torch.zeros(allowed.shape, dtype=like.dtype).masked_fill_(~allowed, float("-inf"))
        self._masks[key] = first, additive.to(like.device)
        return self._masks[key]

    def kept_local(self, kept: torch.Tensor) -> torch.Tensor:
        """The local slots of the kept packed positions this rank holds, in kept order."""
        return self.slot[kept[self.owner[kept] == self.rank]]


def _group():
    from megatron.core import parallel_state

    return parallel_state.get_context_parallel_group()


def _all_gather(x: torch.Tensor) -> torch.Tensor:
    """[n, ...] from every CP rank (equal n) -> [cp x n, ...] in rank order."""
    parts = [torch.empty_like(x) for _ in range(torch.distributed.get_world_size(_group()))]
    torch.distributed.all_gather(parts, x.contiguous(), group=_group())
    return torch.cat(parts)


class _GatherKV(torch.autograd.Function):
    """Forward: every rank's [n, g, d] -> [N, g, d] in packed order. Backward: the gradient of every
    rank's reads summed (all-reduce; gloo has no reduce-scatter), this rank's rows kept."""

    @staticmethod
    def forward(ctx, x, order, local):
        ctx.save_for_backward(order, local)
        ctx.n = x.shape[0]
        return _all_gather(x)[order]

    @staticmethod
    def backward(ctx, grad):
        order, local = ctx.saved_tensors
        grad = grad.contiguous()
        torch.distributed.all_reduce(grad, group=_group())
        return grad[local], None, None


class _GatherRows(torch.autograd.Function):
    """Forward: each rank's rows (counts may differ) -> all rows, ordered by `order` (indices into
    the ranks' rows padded to `width` each). Backward: this rank's rows of the gradient only (every
    rank computed the same loss from the same gathered rows)."""

    @staticmethod
    def forward(ctx, x, order, width, rank):
        ctx.save_for_backward(order)
        ctx.n, ctx.width, ctx.rank = x.shape[0], width, rank
        padded = torch.cat([x, x.new_zeros(width - x.shape[0], *x.shape[1:])]) if x.shape[0] < width else x
        return _all_gather(padded)[order]

    @staticmethod
    def backward(ctx, grad):
        (order,) = ctx.saved_tensors
        full = grad.new_zeros(ctx.width * torch.distributed.get_world_size(_group()), *grad.shape[1:])
        full[order] = grad
        start = ctx.rank * ctx.width
        return full[start:start + ctx.n], None, None, None


def gather_output(output: torch.Tensor, split: ContextSplit, kept: torch.Tensor | None) -> torch.Tensor:
    """The last stage's [1, n_local, ...] output -> [1, n, ...] in the CP=1 order: every packed token's
    (kept None) or the kept positions' in kept order."""
    order, width = gather_order(split, kept)
    return _GatherRows.apply(output[0], order.to(output.device), width, split.rank)[None]


def gather_order(split: ContextSplit, kept: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """(order, width): every rank's output rows padded to `width` and stacked in rank order, then
    taken at `order`, are the CP=1 output rows."""
    if kept is None:
        return split.order, split.local_len
    owner = split.owner[kept]
    width = max(int(torch.bincount(owner, minlength=split.cp).max()), 1)
    # the j-th kept position is its owner's k-th local row, k = how many of the owner's came before
    rank_index = torch.zeros_like(owner)
    for r in range(split.cp):
        mine = owner == r
        rank_index[mine] = torch.arange(int(mine.sum()))
    return owner * width + rank_index, width


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, split: ContextSplit, scale: float,
              gqa: bool) -> torch.Tensor:
    """Local queries [n, heads, d] against every rank's keys / values ([n, groups, d] each, gathered)
    -> [n, heads, d]: one masked SDPA per local chunk."""
    dev = q.device
    order, local = split.order.to(dev), split.local.to(dev)
    k_all, v_all = (_GatherKV.apply(t, order, local) for t in (k, v))  # [N, groups, d]
    outs = []
    for i, (a, b) in enumerate(split.bounds()):
        first, mask = split.mask(a, b, q)
        qc = q[i * split.chunk:(i + 1) * split.chunk].transpose(0, 1)[None]  # [1, heads, c, d]
        kc, vc = (t[first:b].transpose(0, 1)[None] for t in (k_all, v_all))
        out = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, scale=scale, enable_gqa=gqa)
        outs.append(out[0].transpose(0, 1))
    return torch.cat(outs)
