"""Held-out accuracy: greedy generation on the validation prompts, scored by the reward service."""
from __future__ import annotations

import torch

from controller.data import Example, collate
from controller.step import score


async def greedy_accuracy(rollout, reward, examples: list[Example], tokenizer,
                          max_new_tokens: int, batch_size: int = 256) -> float:
    scores = []
    for i in range(0, len(examples), batch_size):
        prompts = collate(examples[i:i + batch_size], tokenizer.pad_token_id)
        gen = await rollout.generate_sequences(prompts, max_new_tokens=max_new_tokens, n=1, greedy=True)
        scores.append(await score(reward, gen, tokenizer))
    return float(torch.cat(scores).mean())
