"""Packed training batches with each prompt computed once for all of its samples.

GRPO-style batches hold n responses per prompt: in the plain packed layout
(tandem/models/packing.py) every row repeats its prompt, so for short responses most of the
forward and backward arithmetic is the same prompt n times. Here consecutive rows with the
same prompt tokens form a group, packed as one sequence

    [prompt | response 1 | response 2 | ... | response n]

with RoPE positions prompt 0..p-1 and every response p.. (as in its own row), and attention
that lets a response token see the prompt and its own response's earlier tokens only (a
segment mask: `PackedSeqParams.tandem_segments`, read by tandem/models/attention.py). Each
row's outputs are then the same functions of the same inputs as in its own row; gradients
through the prompt are summed over the samples inside autograd instead of outside, so
results equal the plain layout up to float rounding (not bit-equal).

Deliberately not here: the plain layout and the readers (`PackedOutput`), which work on this
packing unchanged through `index_valid`.
"""
from __future__ import annotations

import torch

from tandem.models.packing import Packing
from tandem.parallel.device import to_device


class SharedPromptPacking(Packing):
    """A Packing whose rows share one copy of a prompt with their group (see the module doc).
    `response_width`: the padded layout's response columns (the last ones); the prompt is
    the rest. Rows group only with neighbours (rows of a prompt are consecutive, as the
    rollout returns them)."""

    def __init__(self, attention_mask: torch.Tensor, input_ids: torch.Tensor, response_width: int,
                 multiple: int = 1):
        super().__init__(attention_mask, multiple)  # validates the layout; the fields are redone below
        ids = input_ids.cpu()
        b, t = ids.shape
        pw = t - response_width
        plen = (pw - self.first).clamp(min=0)  # each row's real prompt tokens
        rlen = self.lengths - plen
        same = [i > 0 and int(plen[i]) == int(plen[i - 1]) and
                bool((ids[i, self.first[i]:pw] == ids[i - 1, self.first[i - 1]:pw]).all()) for i in range(b)]
        self.prompt_offset = torch.empty(b, dtype=torch.long)
        self.response_offset = torch.empty(b, dtype=torch.long)
        source, positions, segments, seqlens, at = [], [], [], [], 0
        for i in range(b):
            p, r = int(plen[i]), int(rlen[i])
            if not same[i]:  # a new group: its prompt, from this row
                seqlens.append(0)
                self.prompt_offset[i], seg = at, 1
                source.append(i * t + self.first[i] + torch.arange(p))
                positions.append(torch.arange(p))
                segments.append(torch.zeros(p, dtype=torch.long))
                at += p
                seqlens[-1] += p
            else:
                self.prompt_offset[i] = self.prompt_offset[i - 1]
                seg += 1
            self.response_offset[i] = at
            source.append(i * t + pw + torch.arange(r))
            positions.append(p + torch.arange(r))
            segments.append(torch.full((r,), seg, dtype=torch.long))
            at += r
            seqlens[-1] += r
        self.prompt_lengths = plen
        self.groups = len(seqlens)
        real = at
        self.filler = (-real) % multiple
        self.total = real + self.filler
        if self.filler:
            seqlens.append(self.filler)
        self.cu_seqlens = torch.tensor([0] + seqlens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        self.max_seqlen = max(seqlens)
        self.source = torch.cat([*source, torch.zeros(self.filler, dtype=torch.long)])
        self.positions = torch.cat([*positions, torch.arange(self.filler)])
        self.segments = torch.cat([*segments, torch.zeros(self.filler, dtype=torch.long)])

    def params(self, device: torch.device):
        """Packing.params over the groups, plus each token's segment (0: the group's prompt,
        k: its k-th response) for the attention mask."""
        p = super().params(device)
        p.tandem_segments = self.segments  # CPU: moved by the attention where it is used
        return p

    def index_valid(self, first: int, width: int, predicts: bool = False):
        pos = torch.arange(first, first + width)[None] - self.first[:, None]
        valid = (pos >= 0) & (pos < self.lengths[:, None] - int(predicts))
        pos = torch.where(valid, pos, 0)
        plen = self.prompt_lengths[:, None]
        idx = torch.where(pos < plen, self.prompt_offset[:, None] + pos, self.response_offset[:, None] + pos - plen)
        return torch.where(valid, idx, self.prompt_offset[:, None]), valid


def segment_mask(segments: torch.Tensor, shape: tuple[int, int], index) -> torch.Tensor:
    """[sequences, 1, L, L] bool SDPA mask (True = attend) of packed tokens laid out right-padded
    (`index`: their (sequence, position)): causal, and a token of segment k > 0 sees only
    segment 0 and its own segment. Padding gets its own segment -1 (it attends to itself)."""
    seg = segments.new_full(shape, -1).index_put(index, to_device(segments, index[0].device))
    causal = torch.ones(shape[1], shape[1], dtype=torch.bool, device=seg.device).tril()
    same = (seg[:, None, :] == 0) | (seg[:, None, :] == seg[:, :, None])  # [sequences, q, k]
    return (same & causal)[:, None]
