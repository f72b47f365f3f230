"""Padding-free training batches: rows of [left-padded prompt | right-padded response]
packed into one row of their real tokens (megatron's THD format, verl's "remove padding").

The model then sees no pad tokens at all: attention is causal within each sequence
(cu_seqlens, see tandem/models/attention.py) and RoPE restarts at 0 for every sequence,
so every real token gets exactly the outputs of the padded layout. Losses read outputs
back at positions of the padded layout (`PackedOutput.take`).

RoPE: megatron's own THD RoPE loops over the sequences in Python, per layer, with
host-device copies (measured: ~40% of a 0.5B actor step on an H200). Instead the model's
rotary module returns one angle row per packed token (`packed_rope`), and megatron
applies it in one vectorised op, as for unpacked batches (cu_seqlens are left out of
PackedSeqParams so that it does; attention reads its own copy).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


class Packing:
    """Where each row's real tokens go in the packed row. `multiple`: the packed length is
    padded up to it (sequence parallelism splits the sequence over TP ranks) with one
    filler sequence whose outputs nobody reads."""

    def __init__(self, attention_mask: torch.Tensor, multiple: int = 1):
        valid = attention_mask.bool().cpu()
        b, t = valid.shape
        self.width = t
        lengths = valid.sum(1)
        if bool((lengths == 0).any()):
            raise ValueError("a row has no real tokens (attention_mask is all 0)")
        self.first = valid.int().argmax(1)  # index of each row's first real token
        span = torch.arange(t)[None] - self.first[:, None]
        if not bool((valid == ((span >= 0) & (span < lengths[:, None]))).all()):
            raise ValueError("attention_mask: each row's real tokens must be contiguous "
                             "([left-padded prompt | right-padded response])")
        self.lengths = lengths
        self.offsets = torch.cumsum(lengths, 0) - lengths  # packed start of each row
        real = int(lengths.sum())
        self.filler = (-real) % multiple
        self.total = real + self.filler
        seqlens = lengths.tolist() + ([self.filler] if self.filler else [])
        self.cu_seqlens = torch.tensor([0] + seqlens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        self.max_seqlen = max(seqlens)
        rows = torch.repeat_interleave(torch.arange(b), lengths)
        cols = self.first[rows] + torch.arange(real) - self.offsets[rows]
        self.source = torch.cat([rows * t + cols, torch.zeros(self.filler, dtype=torch.long)])
        # position of every packed token within its own sequence (RoPE restarts per sequence)
        self.positions = torch.cat([torch.arange(n) for n in seqlens])

    def pack(self, ids: torch.Tensor) -> torch.Tensor:
        """[B, T] -> [1, N]: the real tokens of every row, then the filler."""
        return ids.reshape(-1)[self.source.to(ids.device)][None]

    def params(self, device: torch.device):
        """megatron PackedSeqParams (THD) without cu_seqlens (see the module doc); attention
        reads `tandem_cu_seqlens` (device) and `tandem_cu_seqlens_cpu`."""
        from megatron.core.packed_seq_params import PackedSeqParams

        p = PackedSeqParams(qkv_format="thd", max_seqlen_q=self.max_seqlen, max_seqlen_kv=self.max_seqlen)
        p.tandem_cu_seqlens = self.cu_seqlens.to(device)
        p.tandem_cu_seqlens_cpu = self.cu_seqlens
        return p

    def index(self, first: int, width: int) -> torch.Tensor:
        """Packed index of padded-layout positions first .. first+width-1 of every row: [B, width].
        Positions on padding map to the row's first token (their values are masked by callers)."""
        pos = torch.arange(first, first + width)[None] - self.first[:, None]
        pos = torch.where((pos >= 0) & (pos < self.lengths[:, None]), pos, 0)
        return self.offsets[:, None] + pos


class PackedOutput:
    """The last stage's output [1, N, ...] of a packed micro-batch, read in the padded layout."""

    def __init__(self, output: torch.Tensor, packing: Packing):
        self.output = output
        self.packing = packing
        self.device = output.device
        self.shape = (len(packing.lengths), packing.width, *output.shape[2:])

    def take(self, first: int, width: int) -> torch.Tensor:
        """Outputs at padded positions first .. first+width-1: [B, width, ...]."""
        return self.output[0][self.packing.index(first, width).to(self.device)]

    def new_zeros(self, *size):
        return self.output.new_zeros(*size)


def take_positions(output, first: int, width: int) -> torch.Tensor:
    """[B, width, ...] outputs at padded positions first.. of a padded tensor or a PackedOutput."""
    if isinstance(output, PackedOutput):
        return output.take(first, width)
    return output[:, first:first + width]


@contextmanager
def packed_rope(model, packing: Packing, device: torch.device):
    """While active, the GPTModel's rotary module returns [N, 1, d] angles: row i is the
    angle of packed token i at its position within its own sequence."""
    rope = getattr(_unwrap(model), "rotary_pos_emb", None)
    if rope is None:
        yield
        return
    if not getattr(rope, "_tandem_packable", False):
        original = rope.forward

        def forward(max_seq_len, *args, **kwargs):
            positions = getattr(rope, "tandem_positions", None)
            if positions is None:
                return original(max_seq_len, *args, **kwargs)
            emb = original(int(rope.tandem_max_len), *args, **kwargs)  # [S, 1, 1, d]
            return emb[positions].squeeze(1)

        rope.forward = forward
        rope._tandem_packable = True
    rope.tandem_positions = packing.positions.to(device)
    rope.tandem_max_len = packing.max_seqlen
    try:
        yield
    finally:
        rope.tandem_positions = None


def _unwrap(model):
    while hasattr(model, "module"):
        model = model.module
    return model
