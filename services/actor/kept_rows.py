"""The rows the colocated rollout generated, and the log-prob pass queued right behind them.

A colocated rollout is the actor itself: the GPU would idle from the last decode step until the
controller had the rows back, had scored them and had sent them again. Instead GenerateSequences'
`keep` settings make the actor keep the rows and queue ComputeLogProb's pass on its worker thread
behind the generation itself (WorkerThread.submit: no turn of the event loop between them); the
controller then names the rows by their key (and, once scoring dropped some, by row numbers) in
ComputeLogProb and UpdateActor, and they never travel back.

Same answer as sending the rows: the pass is redone on the named rows when the request's settings
differ from the queued ones, or when a call that changes the policy or the reference (an update, a
load, SetReference, SFT) arrived after the pass was queued. The worker thread runs calls in arrival
order, so the pass is the read a ComputeLogProb arriving in its place would have made; counting
those calls at their arrival (`wrote`), not when they start on the worker thread, keeps that exact
when an update arrives while the pass still runs (the controller's usual order). UpdateActor on
kept rows trains on them with that pass's old and reference log-probs and the advantages it is
sent, queued behind the pass. Only the last generation's rows are kept; a key this actor does not
hold, or an update whose pass the weights have moved past, is FAILED_PRECONDITION.
"""
from __future__ import annotations

import asyncio
import itertools
import os
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from tandem.data.batch import DataProto
from tandem.generation.sampling import SamplingParams
from tandem.logging import get_logger
from tandem.rollout.outputs import step_rows
from tandem.rpc.errors import FailedPrecondition, InvalidArgument
from tandem.services.actor.front import ActorFront
from tandem.serving.worker_thread import WorkerThread

_log = get_logger("actor.kept_rows")
Settings = tuple[bool, bool, bool]  # ComputeLogProb's calculate_entropy, with_reference, before_update


@dataclass
class _Kept:
    key: str
    settings: Settings
    writes: int  # calls that change the weights that had arrived when the pass was queued
    rows: Future  # -> the generated rows as ComputeLogProb takes them
    result: Future  # -> the pass's (output, rows it left to the update)


class KeptRows:
    def __init__(self, front: ActorFront, thread: WorkerThread):
        self.front, self.thread = front, thread
        self._kept: _Kept | None = None
        self._ids = itertools.count(1)
        self._writes = 0
        self._process = os.urandom(4).hex()  # a restarted service never answers an old key

    def queue_after(self, generation: Future, params: SamplingParams, settings: Settings) -> str:
        """Queue the pass behind `generation` (a WorkerThread.submit future) -> the rows' key."""
        temperature, n = params.temperature, params.n
        rows = self.thread.submit(lambda: step_rows(generation.result(), temperature, n))
        result = self.thread.submit(lambda: self.front.log_probs(rows.result(), *settings))
        key = f"{self._process}-{next(self._ids)}"
        self._kept = _Kept(key, settings, self._writes, rows, result)  # the previous rows are dropped
        return key

    def wrote(self) -> None:
        """A call that changes the policy or the reference has arrived (called before it is queued)."""
        self._writes += 1

    def held(self, key: str) -> _Kept:
        kept = self._kept
        if kept is None or kept.key != key:
            held = f"it holds {kept.key!r}" if kept is not None else "it holds none"
            raise FailedPrecondition(f"rows.kept.key: {key!r} is not the rows this actor kept ({held}: only its last "
                                     "generation's, and not across a restart)")
        return kept

    @staticmethod
    def _index(picked: list[int], count: int) -> torch.Tensor:
        """KeptRows.rows -> the row numbers (every row when empty); INVALID_ARGUMENT when they are not
        increasing numbers of kept rows."""
        if not picked:
            return torch.arange(count)
        index = torch.tensor(picked, dtype=torch.int64)
        if index.min() < 0 or index.max() >= count or (index[1:] <= index[:-1]).any():
            raise InvalidArgument(f"rows.kept.rows: row numbers must be increasing, within the {count} kept rows")
        return index

    async def log_probs(self, key: str, picked: list[int], settings: Settings) -> tuple[DataProto, int]:
        """ComputeLogProb on kept rows: the queued pass's output on the rows picked when it still
        answers the request, else the pass done again on them -> (output, rows left to the update)."""
        kept = self.held(key)
        current = kept.writes == self._writes and settings == kept.settings  # at this request's arrival
        rows = await asyncio.wrap_future(kept.rows)  # a failed generation raises its error here
        index = self._index(picked, len(rows))
        picked_rows = rows.index(index)
        picked_rows.meta = dict(rows.meta)
        try:
            out, skipped = await asyncio.wrap_future(kept.result)
        except Exception:  # the pass failed: this call does it again, on the picked rows
            out = None
        if current and out is not None:
            skip = self.front.update_rows(picked_rows) if settings[2] else 0
            if bool((index[skip:] >= skipped).all()):  # every row it must answer was computed
                _log.info("log_probs.kept_rows", key=key, queued_pass="used")
                return out.index(index), skip
        _log.info("log_probs.kept_rows", key=key, queued_pass="redone" if out is not None else "failed")
        return await self.thread.run(self.front.log_probs, picked_rows, *settings)

    async def for_update(self, key: str, picked: list[int], sent: DataProto,
                         reference: bool) -> tuple[_Kept, torch.Tensor]:
        """UpdateActor on kept rows has arrived: the kept rows and the picked row numbers, once `sent`
        is checked against them and their pass still gives the old log-probs (no call that changes
        the weights arrived since it was queued). The update is then counted as one such call."""
        kept = self.held(key)
        rows = await asyncio.wrap_future(kept.rows)  # ready right after the generation, ahead of the pass
        index = self._index(picked, len(rows))
        if len(sent) != len(index):
            raise InvalidArgument(f"batch: {len(sent)} rows for the {len(index)} kept rows picked")
        if reference and not kept.settings[1]:
            raise FailedPrecondition("rows.kept: the pass queued behind that generation computed no reference "
                                     "log-probs (keep.with_reference) and the update's KL loss needs them")
        if kept.writes != self._writes:
            raise FailedPrecondition("rows.kept: the policy or the reference changed after the log-prob pass queued "
                                     "behind that generation")
        self.wrote()
        return kept, index

    def update_batch(self, kept: _Kept, index: torch.Tensor, sent: DataProto, reference: bool) -> DataProto:
        """On the worker thread, behind the kept pass: UpdateActor's batch from the kept rows picked,
        that pass's old (and, `reference`, reference) log-probs and the rest of `sent` (advantages, ...)."""
        try:
            out, skipped = kept.result.result()
        except Exception as e:
            raise FailedPrecondition(f"rows.kept: the log-prob pass queued behind that generation failed ({e})"
                                     ) from None
        rows = kept.rows.result()
        batch = rows.index(index)
        batch.meta = dict(rows.meta)
        own = self.front.update_rows(batch)
        if own < len(index):  # rows the update does not compute itself take the pass's
            if not bool((index[own:] >= skipped).all()):
                raise FailedPrecondition("rows.kept: the pass queued behind that generation left out rows the update "
                                         "needs (keep.before_update with other rows than these)")
            batch.tensors["old_log_probs"] = out["old_log_probs"][index]
        if reference:
            batch.tensors["ref_log_prob"] = out["ref_log_prob"][index]
        batch.tensors.update(sent.tensors)
        _log.info("update.kept_rows", key=kept.key, rows=len(index))
        return batch
