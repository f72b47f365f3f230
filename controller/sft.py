"""Supervised warm start on the actor service: cross-entropy on prompt -> answer.

The target is each row's `extra_info.answer` when it has one (verl's gsm8k rows: the
solution ending in `#### N`), else `reward_model.ground_truth` (the built-in task's
answer format), followed by EOS. Rows are right-padded; loss_mask marks the answer tokens.

With `trainer.sft.stop_at_accuracy` the warm start ends on a measured skill rather than a step
count: every `eval_freq` steps the policy's greedy accuracy on a dev split (`dev_size` prompts
held out of the training data by `split_dev`, never trained on, and not the validation set
that the run reports) is measured, and the first one at or above the threshold stops it. A
model learning the built-in task does so after a plateau near zero accuracy whose length
depends on the seed and on the last bits of CPU arithmetic, then in a sharp rise; a fixed step
count lands before, inside or after it, and RL's gain with it (bench/results/learning.md). "auto" (the default) is resolve_stop's choice.

Deliberately not here: the loss and optimizer (the actor service's TrainSft), when SFT runs
(the warm start in controller/run.py), how accuracy is measured (controller/validation.py).
"""
from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import replace

import torch

from tandem.config import ConfigError, SftConfig
from tandem.controller.data import Cursor, Example
from tandem.data.batch import DataProto
from tandem.logging import get_logger

_log = get_logger("controller.sft")


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


# stop_at_accuracy "auto" on the built-in task: stopped at the start of its sharp rise, RL gains for
# every seed and thread count measured (bench/results/learning.md).
BUILTIN_STOP_AT_ACCURACY = 0.4
# total_steps "auto" on the built-in task (with its stop, the most it runs); the user's data gets none, as in verl
BUILTIN_TOTAL_STEPS = 4000


def resolve_stop(sft: SftConfig, builtin_task: bool) -> SftConfig:
    """total_steps "auto" -> BUILTIN_TOTAL_STEPS on the built-in task, 0 (no warm start) on the
    user's data; stop_at_accuracy "auto" -> BUILTIN_STOP_AT_ACCURACY on the built-in task, None
    (run total_steps) on the user's data; other values as they are."""
    if sft.total_steps == "auto":
        sft = replace(sft, total_steps=BUILTIN_TOTAL_STEPS if builtin_task else 0)
    if sft.stop_at_accuracy == "auto":
        sft = replace(sft, stop_at_accuracy=BUILTIN_STOP_AT_ACCURACY if builtin_task else None)
    return sft


def _stop(sft: SftConfig) -> float | None:
    if sft.stop_at_accuracy == "auto":
        raise ValueError("trainer.sft.stop_at_accuracy=auto must be resolved first (resolve_stop)")
    return sft.stop_at_accuracy


def split_dev(examples: list[Example], sft: SftConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """(training examples, dev examples): when SFT runs with stop_at_accuracy, `dev_size`
    examples drawn with `seed` are held out (the rest keep their order); else no dev split."""
    if sft.total_steps == 0 or _stop(sft) is None:
        return examples, []
    if sft.dev_size >= len(examples):
        raise ConfigError(f"trainer.sft.dev_size: {sft.dev_size} dev prompts would leave none of the "
                          f"{len(examples)} training prompts to train on; lower it, or set "
                          "trainer.sft.stop_at_accuracy=null")
    held = set(random.Random(seed).sample(range(len(examples)), sft.dev_size))
    return ([e for i, e in enumerate(examples) if i not in held],
            [e for i, e in enumerate(examples) if i in held])


async def run_sft(actor, examples: list[Example], tokenizer, sft: SftConfig, progress=None,
                  dev_accuracy: Callable[[], Awaitable[float]] | None = None, before_step=None) -> dict:
    """SFT steps until `sft.total_steps`, or until `dev_accuracy()` (called every eval_freq steps
    when stop_at_accuracy is set) reaches stop_at_accuracy -> {"metrics": the last step's,
    "steps": steps run, "dev_accuracy": [[step, accuracy], ...]}. before_step: called before each
    step (the run's cancellation check)."""
    cursor = Cursor(len(examples), seed=sft.data_seed)
    stop = _stop(sft) if dev_accuracy is not None else None
    metrics: dict[str, float] = {}
    curve: list[list[float]] = []
    step = 0
    while step < sft.total_steps:
        if before_step is not None:
            before_step()
        batch = sft_batch([examples[i] for i in cursor.next(sft.batch_size)], tokenizer)
        metrics = await actor.train_sft(batch)
        step += 1
        if progress is not None:
            progress.advance()
        if stop is not None and (step % sft.eval_freq == 0 or step == sft.total_steps):
            curve.append([step, await dev_accuracy()])
            if curve[-1][1] >= stop:
                break
    if stop is not None:
        reached = bool(curve) and curve[-1][1] >= stop
        (_log.info if reached else _log.warning)(
            "sft.done" if reached else "sft.threshold_not_reached", steps=step,
            dev_accuracy=curve[-1][1] if curve else None, stop_at_accuracy=stop)
    return {"metrics": metrics, "steps": step, "dev_accuracy": curve}
