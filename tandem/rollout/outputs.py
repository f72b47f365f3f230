"""Combining generated batches (DP shards, DAPO's extra generation rounds).

Each generation left-pads its prompts to its own longest prompt, so prompt-side tensors
differ in width between batches; responses all have max_new_tokens columns.
"""
from __future__ import annotations

import torch

from tandem.data.batch import DataProto

LEFT_PADDED = ("prompts", "input_ids", "attention_mask")


def concat_generations(parts: list[DataProto], pad_id: int) -> DataProto:
    """Concatenate generated batches, left-padding the prompt-side tensors to the widest."""
    width = max(p["prompts"].shape[1] for p in parts)
    padded = []
    for p in parts:
        extra = width - p["prompts"].shape[1]
        if extra:
            p = DataProto(tensors=dict(p.tensors), columns=dict(p.columns), meta=dict(p.meta))
            for key in LEFT_PADDED:
                value = 0 if key == "attention_mask" else pad_id
                p.tensors[key] = torch.nn.functional.pad(p.tensors[key], (extra, 0), value=value)
        padded.append(p)
    return DataProto.concat(padded)
