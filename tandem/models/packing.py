"""Padding-free training batches: rows of [left-padded prompt | right-padded response]
packed into one row of their real tokens (megatron's THD format, verl's "remove padding").

The model then sees no pad tokens at all: attention is causal within each sequence
(cu_seqlens, see tandem/models/attention.py) and RoPE restarts at 0 for every sequence,
so every real token gets exactly the outputs of the padded layout. Losses read outputs
back at positions of the padded layout (`PackedOutput.take`).

Outputs at chosen positions only (`keep_responses`, `selected_outputs`): the actor's
losses read the positions that predict response tokens, so the LM head (and its
[tokens, vocabulary] logits) runs on those alone instead of on every prompt token.

RoPE: megatron's own THD RoPE loops over the sequences in Python, per layer, with
host-device copies (measured: ~40% of a 0.5B actor step on an H200). Instead the model's
rotary module returns one angle row per packed token (`packed_rope`), and megatron
applies it in one vectorised op, as for unpacked batches (cu_seqlens are left out of
PackedSeqParams so that it does; attention reads its own copy). Those rows come as a cos / sin
table where it can (tandem/models/rope_table.py): computed once per forward, not per layer.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from megatron.core.utils import unwrap_model

from tandem.models import rope_table
from tandem.parallel.device import to_device


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
        starts = self.cu_seqlens[:-1].long()  # one vectorised op, not an arange per sequence
        self.positions = torch.arange(self.total) - torch.repeat_interleave(starts, torch.tensor(seqlens))
        self.kept = None  # packed indices the last stage computes outputs for (None: all)
        self.cp = None  # this rank's share under context parallelism (split_context)

    def split_context(self, cp: int, rank: int) -> None:
        """Run this rank's share of the packed tokens (tandem/models/context_parallel.py); the
        total must be a multiple of 2 x cp (`multiple`)."""
        from tandem.models.context_parallel import ContextSplit

        self.cp = ContextSplit(self.total, cp, rank, self.cu_seqlens, getattr(self, "segments", None))

    def keep_responses(self, width: int) -> None:
        """Compute outputs only where they predict one of the last `width` columns' real tokens
        (the response). Reads elsewhere (`PackedOutput.take`) then raise."""
        idx, valid = self.index_valid(self.width - width - 1, width, predicts=True)
        # one output per response token, in row order: the per-token readers then take the head's
        # output as it is. Rows sharing a prompt (shared_prompts.py) repeat its last token here, a
        # few [hidden]-wide rows more through the head instead of gathering the [tokens, vocab] logits
        self.kept = idx[valid]
        self._slot = torch.full((self.total,), -1, dtype=torch.long)
        self._slot[self.kept] = torch.arange(len(self.kept))  # a repeated token: any of its equal outputs

    def pack(self, ids: torch.Tensor) -> torch.Tensor:
        """[B, T] -> [1, N]: the real tokens of every row, then the filler (under context
        parallelism: this rank's share of them)."""
        source = self.source if self.cp is None else self.source[self.cp.local]
        return ids.reshape(-1)[source.to(ids.device)][None]  # on ids' device (the host: no sync)

    def params(self, device: torch.device):
        """megatron PackedSeqParams (THD) without cu_seqlens (see the module doc); attention
        reads `tandem_cu_seqlens` (device), or where varlen attention cannot run
        `tandem_pad_index`: each packed token's (sequence, position) in a right-padded
        [sequences, max_seqlen] layout."""
        from megatron.core.packed_seq_params import PackedSeqParams

        p = PackedSeqParams(qkv_format="thd", max_seqlen_q=self.max_seqlen, max_seqlen_kv=self.max_seqlen)
        p.tandem_cu_seqlens = to_device(self.cu_seqlens, device)
        lens = self.cu_seqlens[1:] - self.cu_seqlens[:-1]
        seq = torch.repeat_interleave(torch.arange(len(lens)), lens)
        p.tandem_pad_index = (seq, torch.arange(self.total) - self.cu_seqlens[seq])  # CPU: moved if used
        if self.cp is not None:
            p.tandem_cp = self.cp
        return p

    def index_valid(self, first: int, width: int, predicts: bool = False):
        """(packed index [B, width], valid [B, width]) of padded-layout positions first ..
        first+width-1 of every row: valid where the position is a real token and, with
        `predicts`, so is the next one (the token its output predicts). Invalid positions map
        to the row's first token (their values are masked by callers)."""
        pos = torch.arange(first, first + width)[None] - self.first[:, None]
        valid = (pos >= 0) & (pos < self.lengths[:, None] - int(predicts))
        return self.offsets[:, None] + torch.where(valid, pos, 0), valid


class PackedOutput:
    """The last stage's output [1, N, ...] of a packed micro-batch, read in the padded layout."""

    def __init__(self, output: torch.Tensor, packing: Packing):
        self.output = output
        self.packing = packing
        self.device = output.device
        self.shape = (len(packing.lengths), packing.width, *output.shape[2:])
        if packing.kept is not None and output.shape[1] != len(packing.kept):
            raise ValueError(f"output has {output.shape[1]} positions, the packing kept {len(packing.kept)}")

    def take(self, first: int, width: int) -> torch.Tensor:
        """Outputs at padded positions first .. first+width-1: [B, width, ...]."""
        idx, valid = self.packing.index_valid(first, width)
        return self.output[0][to_device(self._rows(idx, valid), self.device)]

    def tokens(self, first: int, width: int):
        """(outputs [n, ...] at the n positions that predict a real token, valid [B, width] on
        the CPU): the compact form of `take` for per-token losses, without padding rows."""
        idx, valid = self.packing.index_valid(first, width, predicts=True)
        kept = self.packing.kept
        if kept is not None and len(kept) == self.output.shape[1] and torch.equal(idx[valid], kept):
            return self.output[0], valid  # the kept outputs are these, in order: no copy
        rows = self._rows(idx[valid], None)
        if len(rows) == self.output.shape[1] and bool((rows == torch.arange(len(rows))).all()):
            return self.output[0], valid  # exactly the kept outputs, in order: no copy
        return self.output[0][to_device(rows, self.device)], valid

    def _rows(self, idx: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """Packed indices -> rows of self.output (which holds only the kept ones, if chosen)."""
        if self.packing.kept is None:
            return idx
        rows = self.packing._slot[idx]
        missing = rows < 0 if valid is None else (rows < 0) & valid
        if bool(missing.any()):
            raise ValueError("outputs were computed for the response positions only "
                             "(Packing.keep_responses); this read needs others")
        return rows.clamp(min=0)

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
    angle of packed token i at its position within its own sequence; where megatron applies
    them with plain rotate-half, their [N, 1, 2d] cos / sin table (tandem/models/rope_table.py)."""
    gpt = unwrap_model(model)
    rope = getattr(gpt, "rotary_pos_emb", None)
    if rope is None:
        yield
        return
    if not getattr(rope, "_tandem_packable", False):
        original = rope.forward

        as_table = rope_table.usable(gpt.config)
        if as_table:
            rope_table.install()
            dtype = next(gpt.parameters()).dtype  # the activations'

        def forward(max_seq_len, *args, **kwargs):
            positions = getattr(rope, "tandem_positions", None)
            if positions is None:
                return original(max_seq_len, *args, **kwargs)
            emb = original(int(rope.tandem_max_len), *args, **kwargs)  # [S, 1, 1, d]
            # cos / sin once per forward, not in every layer
            return rope_table.rows(emb, positions, dtype) if as_table else emb[positions].squeeze(1)

        rope.forward = forward
        rope._tandem_packable = True
    positions = packing.positions if packing.cp is None else packing.positions[packing.cp.local]
    rope.tandem_positions = to_device(positions, device)
    rope.tandem_max_len = packing.max_seqlen
    try:
        yield
    finally:
        rope.tandem_positions = None


@contextmanager
def selected_outputs(model, packing: Packing, device: torch.device):
    """While active, the GPTModel's LM head runs on the packing's kept positions only, so its
    output is [1, kept, V/tp]. A no-op without kept positions, on stages without the head, and
    for other heads (the critic's scalar head costs nothing to run everywhere)."""
    head = getattr(unwrap_model(model), "output_layer", None)
    if packing.kept is None or not selects_outputs(model):
        yield
        return
    kept = to_device(packing.kept if packing.cp is None else packing.cp.kept_local(packing.kept), device)
    original, own = head.forward, "forward" in vars(head)
    sequence_parallel = head.sequence_parallel

    def forward(hidden, *args, **kwargs):  # hidden [S, 1, H] (under SP: this rank's S/tp)
        if sequence_parallel:
            from megatron.core.tensor_parallel import (
                gather_from_sequence_parallel_region,
            )

            # the head then all-reduces its input gradient itself; the gather's backward only splits
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return original(hidden[kept], *args, **kwargs)

    head.forward = forward
    head.sequence_parallel = False
    try:
        yield
    finally:
        if own:
            head.forward = original
        else:
            del head.forward
        head.sequence_parallel = sequence_parallel


def selects_outputs(model) -> bool:
    """Whether this stage's head can run on kept positions only (`selected_outputs`)."""
    from megatron.core.tensor_parallel import ColumnParallelLinear

    return isinstance(getattr(unwrap_model(model), "output_layer", None), ColumnParallelLinear)
