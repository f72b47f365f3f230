"""Combining generated batches (DP shards, DAPO's extra generation rounds), and the rows of a
generated batch that the actor and the critic take.

Each generation left-pads its prompts to its own longest prompt, so prompt-side tensors
differ in width between batches; responses all have max_new_tokens columns.
"""
from __future__ import annotations

import torch

from tandem.data.batch import DataProto

LEFT_PADDED = ("prompts", "input_ids", "attention_mask")
SEQ_KEYS = ["input_ids", "attention_mask", "responses", "response_mask"]


def step_rows(gen: DataProto, temperature: float, n: int) -> DataProto:
    """The generated rows as the actor and the critic take them (the controller's, and the
    colocated actor's own for the log-prob pass it queues behind a generation)."""
    seq = gen.select(tensor_keys=SEQ_KEYS)
    seq.meta = {"temperature": temperature, "rollout_n": n}
    return seq


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
