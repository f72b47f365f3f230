"""Optimizer steps over mini-batches, each a gradient accumulation over micro-batches.

The loss of a micro-batch is scaled by its share of the mini-batch's rows, so a
mini-batch gives the same gradient whatever the micro-batch size (for seq-mean modes
exactly; for token-mean up to how tokens fall across micro-batches, as in verl).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

from tandem.data.batch import DataProto
from tandem.train.microbatch import micro_batches
from tandem.train.optim import Optimizer


def train_steps(model, optimizer: Optimizer, minis: list[DataProto], micro_rows: int,
                loss_fn: Callable, grad_norm_key: str, lr_key: str) -> dict[str, float]:
    """Run one optimizer step per mini-batch; return metrics averaged over micro-batches."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    model.train()
    for mini in minis:
        for mb in micro_batches(mini, micro_rows):
            loss, metrics = loss_fn(model, mb)
            (loss * (len(mb) / len(mini))).backward()
            for k, v in metrics.items():
                sums[k] += v
                counts[k] += 1
        sums[lr_key] += optimizer.lr
        counts[lr_key] += 1
        sums[grad_norm_key] += optimizer.step()
        counts[grad_norm_key] += 1
    return {k: sums[k] / counts[k] for k in sums}
