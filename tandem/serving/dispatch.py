"""How the front door lays a batch out over data-parallel ranks, and puts results back.

A batch is cut into mini-batches (the optimizer's steps) and each mini-batch into `dp`
contiguous shards, one per DP rank. Log-probs use the same layout as the update that
follows them, so every row meets the same micro-batch shape in both (bit-equal old
log-probs on the first on-policy mini-batch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tandem.data.batch import DataProto
from tandem.train.microbatch import Split, micro_batches, mini_batches


@dataclass
class Layout:
    shards: list[list[DataProto | None]]  # [dp][mini] this rank's rows of each mini-batch (None: no rows)
    rows: list[list[torch.Tensor]]  # [dp][mini] their row numbers in the original batch
    minis: list[DataProto]  # the whole mini-batches, in step order


def layout(batch: DataProto, rows_per_mini: int, dp: int, *, epochs: int = 1,
           shuffle: bool = False, seed: int = 0, allow_empty: bool = True) -> Layout:
    """Mini-batches of `rows_per_mini` rows (epochs passes, optionally shuffled), each split
    into `dp` near-equal contiguous shards. allow_empty=False: every shard must have a row
    (an update needs every DP rank in every step)."""
    numbered = batch.union(DataProto(tensors={"__row__": torch.arange(len(batch))}))
    minis = mini_batches(numbered, rows_per_mini, epochs, shuffle, seed)
    shards: list[list] = [[] for _ in range(dp)]
    rows: list[list] = [[] for _ in range(dp)]
    for mini in minis:
        if len(mini) < dp and not allow_empty:
            from tandem.rpc.errors import InvalidArgument

            raise InvalidArgument(f"batch: a mini-batch of {len(mini)} rows cannot be split over {dp} "
                                  "data-parallel ranks (every rank takes part in each optimizer step); "
                                  "send more rows or raise ppo_mini_batch_size")
        parts = mini.chunk(min(dp, len(mini)))
        for r in range(dp):
            part = parts[r] if r < len(parts) else None
            rows[r].append(part["__row__"] if part is not None else torch.zeros(0, dtype=torch.long))
            shards[r].append(_drop_row_numbers(part) if part is not None else None)
    return Layout(shards, rows, [_drop_row_numbers(m) for m in minis])


def _drop_row_numbers(b: DataProto) -> DataProto:
    return DataProto(tensors={k: v for k, v in b.tensors.items() if k != "__row__"},
                     columns=b.columns, meta=dict(b.meta))


def gather_rows(lay: Layout, results: list[list[DataProto | None]], num_rows: int) -> DataProto:
    """Per-rank, per-mini results (row-aligned with the shards) -> one batch in original order."""
    parts, order = [], []
    for r, per_mini in enumerate(results):
        for m, part in enumerate(per_mini):
            if part is not None:
                parts.append(part)
                order.append(lay.rows[r][m])
    out = DataProto.concat(parts)
    idx = torch.cat(order)
    if len(idx) != num_rows or len(out) != num_rows:
        raise RuntimeError(f"gather_rows: got {len(out)} rows for {num_rows}")
    return out.index(torch.argsort(idx))


def train_layout(batch: DataProto, rows_per_mini: int, dp: int, *, epochs: int, shuffle: bool,
                 seed: int, units: Callable[[DataProto], int]) -> Layout:
    """`layout` for an update: no empty shard, and each shard's meta carries its whole
    mini-batch's loss units (`units(mini)`: what the gradient is divided by) and tokens (what
    the MoE load-balancing loss is averaged over, tandem/train/moe_aux_loss.py)."""
    lay = layout(batch, rows_per_mini, dp, epochs=epochs, shuffle=shuffle, seed=seed, allow_empty=False)
    for mini, shards in zip(lay.minis, zip(*lay.shards)):
        n, tokens = units(mini), int(mini["attention_mask"].sum())
        for s in shards:
            s.meta["loss_units"] = n
            s.meta["tokens"] = tokens
    return lay


def combine_train_metrics(results: list[dict], num_minis: int) -> dict[str, float]:
    """Per-DP-rank weighted metric sums -> mini-batch means; step metrics (grad norm, lr)
    are the same on every rank: take DP rank 0's."""
    out: dict[str, float] = {}
    for r in results:
        for k, v in r["weighted"].items():
            out[k] = out.get(k, 0.0) + v / num_minis
    out.update(results[0]["steps"])
    return out


def check_lockstep(lay: Layout, split: Split) -> None:
    """Expert parallelism: every MoE layer's all-to-all spans data-parallel ranks, so every DP
    rank must run the same number of micro-batches in each mini-batch (or all wait forever)."""
    from tandem.rpc.errors import InvalidArgument

    for i, shards in enumerate(zip(*lay.shards)):
        counts = [0 if s is None else len(micro_batches(s, split)) for s in shards]
        if len(set(counts)) > 1:
            rows = [0 if s is None else len(s) for s in shards]
            raise InvalidArgument(
                f"batch: mini-batch {i} splits into {rows} rows = {counts} micro-batches {_split_text(split)} "
                f"over {len(shards)} data-parallel ranks; expert parallelism needs the same number of "
                f"micro-batches on every rank (send mini-batches of a multiple of {len(shards)} rows)")


def check_split(batch: DataProto, split: Split) -> None:
    """A token budget must hold every row (rows are never cut): refused before any rank runs, so
    that nothing is half done (an update's earlier mini-batches already stepped)."""
    from tandem.rpc.errors import InvalidArgument

    if isinstance(split, int) or not len(batch) or "attention_mask" not in batch.tensors:
        return
    lengths = batch["attention_mask"].sum(1)
    if int(lengths.max()) > split.max_tokens:
        row = int(lengths.argmax())
        raise InvalidArgument(f"attention_mask: row {row} has {int(lengths[row])} tokens, more than the micro-batch "
                              f"token budget of {split.max_tokens} (*_max_token_len_per_gpu; rows are never cut)")


def _split_text(split: Split) -> str:
    return f"of up to {split} rows" if isinstance(split, int) else f"of up to {split.max_tokens} tokens"
