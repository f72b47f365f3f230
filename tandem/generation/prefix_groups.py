"""Which decode slots hold the n samples of one prompt, for the prefix ("cascade") decode attention.

The scheduler admits a prompt's n samples together into n slots, and the prefill copies the
prompt's K and V into each of them. The decode attention (decode_attention.py) can then read
the prompt once per group instead of once per slot. It needs, on the device:

    plen     [slots] int32: the shared prompt length of each slot's group (0: the slot reads its
             whole cache itself)
    members  [slots, n] int32: at a group's first slot, the group's n slots; -1 elsewhere

A freed slot is refilled with another prompt's sample while the rest of its old group may still
decode (continuous batching). The old group then stops sharing: its entry is cleared and its other
slots read their own full copy of the prompt (plen 0), so no stale entry ever writes a partial
result for a slot that has changed hands. Updated between decode windows (at prefill), never
inside a captured step; the tensors keep their addresses for the captured graphs.
"""
from __future__ import annotations

import torch


class PrefixGroups:
    def __init__(self, slots: int, n: int, device: torch.device):
        self.n = n
        self.plen = torch.zeros(slots, dtype=torch.int32, device=device)
        self.members = torch.full((slots, n), -1, dtype=torch.int32, device=device)
        self._group_of: dict[int, tuple[int, ...]] = {}  # slot -> its group's slots (host copy)

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.plen, self.members

    def reset(self) -> None:
        """No groups (a new request)."""
        self.plen.zero_()
        self.members.fill_(-1)
        self._group_of.clear()

    def admit(self, groups: list[tuple[tuple[int, ...], int]]) -> None:
        """groups: (the n slots, the prompt length) of each prompt just prefilled."""
        if not groups:
            return
        if any(len(slots) != self.n for slots, _ in groups):
            raise ValueError(f"a prompt group must hold n={self.n} slots, got {[len(s) for s, _ in groups]}")
        broken = {self._group_of[s] for slots, _ in groups for s in slots if s in self._group_of}
        cleared, firsts, rows, lens = [], [], [], []
        for old in broken:  # a slot changed hands: the old group's others read their own copies
            cleared += old
            firsts.append(min(old))
            for s in old:
                del self._group_of[s]
        dev = self.plen.device
        if broken:
            self.plen[torch.tensor(cleared, device=dev)] = 0
            self.members[torch.tensor(firsts, device=dev)] = -1
        for slots, length in groups:
            for s in slots:
                self._group_of[s] = slots
            rows.append(sorted(slots))
            lens += [length] * self.n
        flat = torch.tensor([s for r in rows for s in r], device=dev)
        self.plen[flat] = torch.tensor(lens, dtype=torch.int32, device=dev)
        self.members[torch.tensor([r[0] for r in rows], device=dev)] = torch.tensor(rows, dtype=torch.int32,
                                                                                   device=dev)
