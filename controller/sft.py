"""Supervised warm start on the actor service: cross-entropy on prompt -> answer.

The target is each row's `extra_info.answer` when it has one (verl's gsm8k rows: the
solution ending in `#### N`), else `reward_model.ground_truth` (the built-in task's
answer format), followed by EOS. Rows are right-padded; loss_mask marks the answer tokens.
Deliberately not here: the loss and optimizer (the actor service's TrainSft), when SFT runs
(the warm start in controller/run.py).
"""
from __future__ import annotations

import torch

from controller.data import Cursor, Example
from tandem.data.batch import DataProto


def sft_batch(examples: list[Example], tokenizer) -> DataProto:
    seqs, masks = [], []
    for e in examples:
        target = e.extra_info.get("answer") if isinstance(e.extra_info, dict) else None
        answer = tokenizer(target or e.ground_truth, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(e.prompt_ids + answer)
        masks.append([0] * len(e.prompt_ids) + [1] * len(answer))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    loss = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, :len(s)] = torch.tensor(s)
        attn[i, :len(s)] = 1
        loss[i, :len(m)] = torch.tensor(m)
    return DataProto(tensors={"input_ids": ids, "attention_mask": attn, "loss_mask": loss})


async def run_sft(actor, examples: list[Example], tokenizer, steps: int, batch_size: int,
                  seed: int, progress=None, before_step=None) -> dict[str, float]:
    """before_step: called before each step (the run's cancellation check)."""
    cursor = Cursor(len(examples), seed=seed)
    metrics: dict[str, float] = {}
    for _ in range(steps):
        if before_step is not None:
            before_step()
        batch = sft_batch([examples[i] for i in cursor.next(batch_size)], tokenizer)
        metrics = await actor.train_sft(batch)
        if progress is not None:
            progress.advance()
    return metrics
