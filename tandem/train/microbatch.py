"""Mini-batches (one optimizer step each) and micro-batches (one forward/backward each)."""
from __future__ import annotations

import torch

from tandem.data.batch import DataProto


def mini_batches(batch: DataProto, rows: int, epochs: int, shuffle: bool,
                 seed: int) -> list[DataProto]:
    """`epochs` passes over the batch in chunks of `rows` rows (a partial last chunk is kept)."""
    if rows < 1:
        raise ValueError(f"mini-batch size must be >= 1, got {rows}")
    out = []
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        b = batch.index(torch.randperm(len(batch), generator=gen)) if shuffle else batch
        out.extend(b.split(rows))
    return out


def micro_batches(batch: DataProto, rows: int) -> list[DataProto]:
    if rows < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {rows}")
    return batch.split(rows)
