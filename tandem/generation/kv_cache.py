"""The engine's preallocated KV cache: one K and one V tensor for all layers and slots.

Layout [layers, slots, kv_heads (this TP rank's query groups), max_len, head_dim]: a
slot's sequence starts at position 0 (no padding), decode writes the new key of every
slot at its own position (positions are device tensors, so a captured CUDA graph stays
valid as they advance): the Triton decode attention (decode_attention.py) writes it
itself, the SDPA path with one scatter per layer (`write_decode`) before attending over
the first `kv_len` positions of each slot under a per-slot length mask.

Not here: paging. The n samples of a prompt get copies of its prefill KV; the Triton
kernel reads the prompt's part once per group from the first copy (prefix_groups.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    k: torch.Tensor  # [layers, slots, kv_heads, max_len, head_dim]
    v: torch.Tensor

    @classmethod
    def allocate(cls, layers: int, slots: int, kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> "KVCache":
        shape = (layers, slots, kv_heads, max_len, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(shape, dtype=dtype, device=device))

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def fits(self, slots: int, max_len: int, dtype: torch.dtype) -> bool:
        return self.slots >= slots and self.max_len >= max_len and self.k.dtype == dtype

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def write_prefill(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [n_slots, kv_heads, L, head_dim] -> positions 0..L-1 of `slots` [n_slots]."""
        length = k.shape[2]
        self.k[layer, :, :, :length].index_copy_(0, slots, k)
        self.v[layer, :, :, :length].index_copy_(0, slots, v)

    def write_decode(self, layer: int, batch: int, positions: torch.Tensor,
                     k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [batch, kv_heads, head_dim]: one new entry per slot 0..batch-1 at
        positions [batch] (int64, device)."""
        b, g, d = k.shape
        index = positions.view(b, 1, 1, 1).expand(b, g, 1, d)
        self.k[layer, :batch].scatter_(2, index, k.unsqueeze(2))
        self.v[layer, :batch].scatter_(2, index, v.unsqueeze(2))
