"""The front door of a rank group (rank 0): a worker's API over all of its ranks.

A model service's RPC arrives on rank 0 only. The front door lays the batch out over the
data-parallel ranks (`dispatch.py`: mini-batches first, then one contiguous shard per DP
rank), runs the worker's method on every rank (`rank_group.py`) and reassembles the
output ranks' results, in the batch's row order for per-row outputs and as mini-batch
means for training metrics. Services build their role's API (actor, critic, rollout) from
these three calls; none of them touches ranks or layouts itself.
"""
from __future__ import annotations

from typing import Callable

from tandem.data.batch import DataProto
from tandem.serving.dispatch import (
    check_lockstep,
    check_split,
    combine_train_metrics,
    gather_rows,
    layout,
    train_layout,
)
from tandem.serving.rank_group import RankGroup
from tandem.train.microbatch import Split


class FrontDoor:
    def __init__(self, group: RankGroup, target: str, lockstep: bool = False):
        """lockstep: every DP rank must run the same number of micro-batches per mini-batch
        (expert parallelism: the expert all-to-alls span DP ranks; dispatch.check_lockstep)."""
        self.group = group
        self.target = target
        self.lockstep = lockstep

    @property
    def dp(self) -> int:
        return self.group.dp_size

    def map_rows(self, method: str, batch: DataProto, *args, rows_per_mini: int, micro: Split) -> DataProto:
        """`method(shards, *args)` on every DP rank, `shards` being its rows of each
        mini-batch of `rows_per_mini`; the per-row results back in the batch's order."""
        lay = self._layout(batch, rows_per_mini, micro)
        results = self.group.run(self.target, method, [(s, *args) for s in lay.shards])
        return gather_rows(lay, results, len(batch))

    def map_rows_pair(self, method: str, first: DataProto, second: DataProto, *args,
                      rows_per_mini: tuple[int, int], micro: tuple[Split, Split]) -> tuple[DataProto, DataProto]:
        """map_rows over two batches in one call on every rank: `method(first_shards, second_shards, *args)`
        returns the per-row results of each (e.g. two passes run back to back, read back once)."""
        lays = [self._layout(b, n, split) for b, n, split in zip((first, second), rows_per_mini, micro)]
        results = self.group.run(self.target, method, [(a, b, *args) for a, b in zip(lays[0].shards, lays[1].shards)])
        return tuple(gather_rows(lay, [r[i] for r in results], len(b))
                     for i, (lay, b) in enumerate(zip(lays, (first, second))))

    def _layout(self, batch: DataProto, rows_per_mini: int, micro: Split):
        check_split(batch, micro)
        lay = layout(batch, rows_per_mini, self.dp)
        if self.lockstep:
            check_lockstep(lay, micro)
        return lay

    def train(self, method: str, batch: DataProto, *args, rows_per_mini: int, micro: Split,
              units: Callable[[DataProto], int], epochs: int = 1, shuffle: bool = False,
              seed: int = 0) -> dict[str, float]:
        """`method(shards, *args)` for an update: one optimizer step per mini-batch, each
        shard's meta carrying its mini-batch's loss units; -> mini-batch mean metrics."""
        return self.train_with_rows(method, batch, *args, rows_per_mini=rows_per_mini, micro=micro,
                                    units=units, epochs=epochs, shuffle=shuffle, seed=seed)[0]

    def train_with_rows(self, method: str, batch: DataProto, *args, rows_per_mini: int, micro: Split,
                        units: Callable[[DataProto], int], epochs: int = 1, shuffle: bool = False,
                        seed: int = 0) -> tuple[dict[str, float], DataProto | None]:
        """`train`, and the update's per-row outputs (its results' "rows", e.g. on-policy old
        log-probs) back in the batch's row order (None when it has none; one epoch only)."""
        check_split(batch, micro)
        lay = train_layout(batch, rows_per_mini, self.dp, epochs=epochs, shuffle=shuffle, seed=seed, units=units)
        if self.lockstep:
            check_lockstep(lay, micro)
        results = self.group.run(self.target, method, [(s, *args) for s in lay.shards])
        metrics = combine_train_metrics(results, len(lay.minis))
        per_row = [r.get("rows") for r in results]
        if epochs != 1 or any(rows is None or any(x is None for x in rows) for rows in per_row):
            return metrics, None
        return metrics, gather_rows(lay, per_row, len(batch))

    def everywhere(self, method: str, *args):
        """`method(*args)` on every rank; -> DP rank 0's result."""
        return self.group.run_all(self.target, method, *args)[0]
