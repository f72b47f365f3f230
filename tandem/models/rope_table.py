"""RoPE from a cos / sin table computed once per forward, instead of in every layer.

megatron's unfused RoPE takes the angles and computes cos and sin inside each attention
(`_apply_rotary_pos_emb_bshd`). Compiled, inductor fuses those into the kernel that splits
q / k / v, so every layer recomputes fp32 sin and cos for every head of every token (angles
reach hundreds of radians: the costly range reduction, we think): measured 117 us per layer
call on an H200 for a 0.5B micro-batch of 11k tokens, ~10x what that kernel's bytes take.

Here the packed rotary module (tandem/models/packing.py) hands megatron a table instead of
the angles: [N, 1, 2r] = [cos | sin] of the [N, 1, r] angles, and megatron's attention calls
`apply_rotary_pos_emb`, which this module replaces in megatron's attention module by a
version that takes the table and otherwise calls megatron's own. A table is told apart by
its width: megatron's angles are never wider than the head (it rotates their width and
passes the rest through). The values are megatron's `(cos(angles) * mscale).to(dtype)` (at
mscale 1; another mscale scales the rounded table: close, not bit-identical).

Only for what megatron computes with plain rotate-half (no interleaving, no multi-latent
attention, no fused TE kernel): `usable(config)`.

Deliberately not here: which angle each packed token gets (packing.py), generation's RoPE
(tandem/generation/ has its own cos / sin tables).
"""
from __future__ import annotations

import torch


def usable(config) -> bool:
    """Whether megatron would apply RoPE to this config with the plain rotate-half formula."""
    return not (getattr(config, "apply_rope_fusion", False) or getattr(config, "rotary_interleaved", False)
                or getattr(config, "multi_latent_attention", False))


def table(angles: torch.Tensor) -> torch.Tensor:
    """[..., r] angles (fp32) -> [..., 2r] = [cos | sin]."""
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


def rows(angles: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[S, 1, 1, r] angles of positions 0..S-1 -> [N, 1, 2r] table rows of the tokens at `positions`
    (cos / sin of S angles, not of N), in the activations' dtype: rounded here, once, as megatron
    rounds `cos(angles).to(t.dtype)`. Left to the compiled layers, that rounding is kept in one
    graph and fused away in another (inductor does not emulate intermediate casts), and the
    no-grad and training forwards then differ (ppo_kl of an on-policy update not 0).
    The width is marked static for torch.compile: a symbolic width (dynamic=True makes every
    input dimension symbolic) trips inductor's stride-order check (ValueRangeError)."""
    out = table(angles).to(dtype)[positions].squeeze(1)
    torch._dynamo.mark_static(out, out.dim() - 1)
    return out


def is_table(freqs: torch.Tensor, t: torch.Tensor) -> bool:
    return freqs.shape[-1] > t.shape[-1]


def apply(t: torch.Tensor, cos_sin: torch.Tensor, mscale: float = 1.0) -> torch.Tensor:
    """megatron's `_apply_rotary_pos_emb_bshd` (rotate-half) with cos / sin given: in t's dtype
    already (`rows`), or fp32 to be scaled and rounded as megatron does."""
    cos, sin = cos_sin.chunk(2, dim=-1)
    if cos.dtype != t.dtype or mscale != 1.0:
        cos, sin = (cos * mscale).to(t.dtype), (sin * mscale).to(t.dtype)
    from megatron.core.models.common.embeddings.rope_utils import _rotate_half

    rot = cos.shape[-1]
    t, t_pass = t[..., :rot], t[..., rot:]
    return torch.cat((t * cos + _rotate_half(t, False) * sin, t_pass), dim=-1)


def install() -> None:
    """Let megatron's attention take tables (idempotent): its `apply_rotary_pos_emb` becomes one
    that applies a table here and passes angles to megatron's own."""
    from megatron.core.transformer import attention

    original = attention.apply_rotary_pos_emb
    if getattr(original, "_tandem_table", False):
        return

    def apply_rotary_pos_emb(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None, **kwargs):
        if cu_seqlens is None and is_table(freqs, t):
            return apply(t, freqs, mscale)
        return original(t, freqs, config, cu_seqlens=cu_seqlens, mscale=mscale, cp_group=cp_group, **kwargs)

    apply_rotary_pos_emb._tandem_table = True
    attention.apply_rotary_pos_emb = apply_rotary_pos_emb
