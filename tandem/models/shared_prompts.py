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

A response's last token is left out: its output would predict the token after the row, and no
other token attends to it (it is the last of its segment), so it adds nothing to any output the
readers take (those that predict response tokens) nor to any gradient (a row of n-token
responses packs n-1 of them). Reading it (`index_valid` without `predicts`) raises.

Deliberately not here: the plain layout and the readers (`PackedOutput`), which work on this
packing unchanged through `index_valid`.
"""
from __future__ import annotations

import torch

from tandem.models.packing import Packing
from tandem.models.shared_prompt_attention import SharedPromptIndex
from tandem.parallel.device import to_device


class SharedPromptPacking(Packing):
    """A Packing whose rows share one copy of a prompt with their group (see the module doc).
    `response_width`: the padded layout's response columns (the last ones); the prompt is
    the rest. Rows group only with neighbours (rows of a prompt are consecutive, as the
    rollout returns them)."""

    def __init__(self, attention_mask: torch.Tensor, input_ids: torch.Tensor, response_width: int,
                 multiple: int = 1):
        super().__init__(attention_mask, multiple)  # validates the layout; the fields are redone below
        valid = attention_mask.bool().cpu()
        b, t = valid.shape
        pw = t - response_width
        plen = (pw - self.first).clamp(min=0)  # each row's real prompt tokens
        rlen = (self.lengths - plen - 1).clamp(min=0)  # its response tokens packed: all but the last
        prompt = torch.where(valid[:, :pw], input_ids.cpu()[:, :pw], -1)  # equal rows: the same prompt
        new = torch.ones(b, dtype=torch.bool)  # the row starts a group (and packs the prompt)
        new[1:] = (prompt[1:] != prompt[:-1]).any(1)
        group = new.cumsum(0) - 1
        leader = new.nonzero().squeeze(1)  # each group's first row
        count = plen * new + rlen  # the tokens each row adds to the packed row
        start = count.cumsum(0) - count
        self.prompt_offset = start[leader][group]
        self.response_offset = start + plen * new
        self.prompt_lengths = plen
        self.packed_lengths = plen + rlen  # the row's first tokens that are packed (the rest: its last)
        self.groups = len(leader)
        segment = torch.arange(b) - leader[group] + 1  # k: the group's k-th response
        real = int(count.sum())
        rows = torch.repeat_interleave(torch.arange(b), count)
        k = torch.arange(real) - start[rows]  # index within the row's own tokens
        in_prompt = k < (plen * new)[rows]
        after = k - (plen * new)[rows]  # index within the row's response
        self.filler = (-real) % multiple
        self.total = real + self.filler
        seqlens = torch.zeros(self.groups, dtype=torch.long).index_add_(0, group, count).tolist()
        seqlens += [self.filler] if self.filler else []
        self.cu_seqlens = torch.tensor([0] + seqlens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        self.max_seqlen = max(seqlens)
        cols = torch.where(in_prompt, self.first[rows] + k, pw + after)
        self.source = torch.cat([rows * t + cols, torch.zeros(self.filler, dtype=torch.long)])
        self.positions = torch.cat([torch.where(in_prompt, k, plen[rows] + after), torch.arange(self.filler)])
        self.segments = torch.cat([torch.where(in_prompt, 0, segment[rows]), torch.zeros(self.filler, dtype=torch.long)])
        # the flash path's two calls (tandem/models/shared_prompt_attention.py): segments in packed order
        # (each row: its group's prompt if it leads the group, then its response), then the filler
        seg = torch.stack([plen * new, rlen], 1).flatten().tolist() + [self.filler]
        self.shared_index = SharedPromptIndex.build(seg, self.response_offset, rlen, self.prompt_offset, plen)

    def params(self, device: torch.device):
        """Packing.params over the groups, plus each token's segment (0: the group's prompt,
        k: its k-th response) for the padded path's attention mask, and the flash path's indices."""
        p = super().params(device)
        p.tandem_segments = self.segments  # CPU: moved by the attention where it is used
        p.tandem_shared = self.shared_index.to(device)
        return p

    def index_valid(self, first: int, width: int, predicts: bool = False):
        pos = torch.arange(first, first + width)[None] - self.first[:, None]
        valid = (pos >= 0) & (pos < self.lengths[:, None] - int(predicts))
        if bool((valid & (pos >= self.packed_lengths[:, None])).any()):
            raise ValueError("SharedPromptPacking leaves each response's last token out (its output predicts "
                             "nothing); this read needs it")
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
