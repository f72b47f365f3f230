"""The rows the colocated rollout generated, and the log-prob pass queued right behind them.

Without it the GPU idles from the last decode step until the controller has the rows back,
has scored them and has sent them again in ComputeLogProb (~0.3 s of a 5.5 s step at the 0.5B
e2e shape, the trace's largest gap). With GenerateSequences' log_probs_after the actor queues
ComputeLogProb's pass on its worker thread behind the generation itself (WorkerThread.submit:
no turn of the event loop between them) and keeps the rows; ComputeLogProb(kept_rows) then
returns that pass's result.

Same answer as sending the rows: the pass is redone on the kept rows when the request's settings
differ from the queued ones, or when a call that changes the policy or the reference (an update,
a load, SetReference, SFT) arrived after the pass was queued. The worker thread runs calls in
arrival order, so the pass is the read a ComputeLogProb arriving in its place would have made;
counting those calls at their arrival (`wrote`), not when they start on the worker thread, keeps
that exact when an update arrives while the pass still runs (the controller's usual order). UpdateActor(kept_rows) trains on the kept rows with that pass's
old and reference log-probs and the advantages it is sent (update_batch), queued behind the pass:
the controller sends it as soon as scoring ends when the advantages need no log-probs. Only the
last generation's rows are kept (~15 MB at 512 rows x 776 tokens); a key this actor does not hold,
or an update whose pass the weights have moved past, is FAILED_PRECONDITION: the caller sends the batch.
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
Settings = tuple[bool, bool, int]  # ComputeLogProb's calculate_entropy, with_reference, policy_from_row


@dataclass
class _Kept:
    key: str
    settings: Settings
    writes: int  # calls that change the weights that had arrived when the pass was queued
    rows: Future  # -> the generated rows as ComputeLogProb takes them
    result: Future  # -> the pass's output


class KeptRows:
    def __init__(self, front: ActorFront, thread: WorkerThread):
        self.front, self.thread = front, thread
        self._kept: _Kept | None = None
        self._ids = itertools.count(1)
        self._writes = 0
        self._process = os.urandom(4).hex()  # a restarted service never answers an old key

    def check(self, prompts: int, params: SamplingParams, settings: Settings) -> None:
        """Before the generation: the settings of the queued pass fit the rows it will have
        (INVALID_ARGUMENT naming the field; nothing generated, nothing kept)."""
        per_mini = self.front.actor_cfg.ppo_mini_batch_size * params.n
        self.front.check_policy_from_row(settings[2], prompts * params.n, per_mini)

    def queue_after(self, generation: Future, params: SamplingParams, settings: Settings) -> str:
        """Queue the pass behind `generation` (a WorkerThread.submit future) -> the rows' key."""
        temperature, n = params.temperature, params.n
        rows = self.thread.submit(lambda: step_rows(generation.result(), temperature, n))
        result = self.thread.submit(lambda: self.front.compute_log_prob(rows.result(), *settings))
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
            raise FailedPrecondition(f"kept_rows: {key!r} is not the rows this actor kept ({held}: only its last "
                                     "generation's with log_probs_after, and not across a restart); send the batch")
        return kept

    async def log_probs(self, key: str, settings: Settings) -> DataProto:
        """ComputeLogProb on the kept rows: the queued pass's output when it still answers the request."""
        kept = self.held(key)
        current = kept.writes == self._writes and settings == kept.settings  # at this request's arrival
        try:
            out = await asyncio.wrap_future(kept.result)
        except Exception:  # the pass failed (or its generation did): this call does it again, on the kept rows
            out = None
        if current and out is not None:
            _log.info("log_probs.kept_rows", key=key, queued_pass="used")
            return out
        rows = await asyncio.wrap_future(kept.rows)  # a failed generation raises its error here
        _log.info("log_probs.kept_rows", key=key, queued_pass="redone" if out is not None else "failed")
        return await self.thread.run(self.front.compute_log_prob, rows, *settings)

    async def for_update(self, key: str, sent: DataProto, on_policy_rows: int | None, reference: bool) -> _Kept:
        """UpdateActor(kept_rows) has arrived: the kept rows, once `sent` is checked against them and
        their pass still gives the old log-probs (no call that changes the weights arrived since it
        was queued). The update is then counted as one such call."""
        kept = self.held(key)
        rows = await asyncio.wrap_future(kept.rows)  # ready right after the generation, ahead of the pass
        (_, with_reference, from_row), index = kept.settings, sent.tensors.get("kept_row")
        if index is None or index.dtype != torch.int64 or index.dim() != 1:
            raise InvalidArgument("kept_row: the batch must carry 'kept_row', int64 [rows]: which kept rows to train on")
        if len(index) and (index.min() < 0 or index.max() >= len(rows) or (index[1:] <= index[:-1]).any()):
            raise InvalidArgument(f"kept_row: row numbers must be increasing, within the {len(rows)} kept rows")
        own = len(index) if on_policy_rows == 0 else on_policy_rows or 0  # leading rows: the update's own
        taken = index[own:]  # rows that take the pass's old log-probs
        if (taken < from_row).any():
            raise InvalidArgument(f"kept_row: rows {taken[taken < from_row].tolist()[:8]} have no old log-probs in the "
                                  f"queued pass (it started at row {from_row}): they must be among on_policy_rows")
        if reference and not with_reference:
            raise FailedPrecondition("kept_rows: the queued pass computed no reference log-probs (log_probs_after."
                                     "with_reference) and the update's KL loss needs them; send the batch")
        if kept.writes != self._writes:
            raise FailedPrecondition("kept_rows: the policy or the reference changed after the log-prob pass queued "
                                     "behind that generation; send the batch")
        self.wrote()
        return kept

    def update_batch(self, kept: _Kept, sent: DataProto, on_policy_rows: int | None, reference: bool) -> DataProto:
        """On the worker thread, behind the kept pass: UpdateActor's batch from the kept rows that
        `sent['kept_row']` names (checked by for_update), that pass's old (and, `reference`,
        reference) log-probs and the rest of `sent` (advantages, ...). on_policy_rows: None, not
        on-policy; 0, every row's old log-probs are the update's own (none taken); k, the first k rows' are."""
        try:
            out = kept.result.result()
        except Exception as e:
            raise FailedPrecondition(f"kept_rows: the log-prob pass queued behind that generation failed ({e}); "
                                     "send the batch") from None
        rows, index = kept.rows.result(), sent["kept_row"]
        batch = rows.index(index)
        batch.meta = dict(rows.meta)
        if on_policy_rows != 0:
            batch.tensors["old_log_probs"] = out["old_log_probs"][index]
        if reference:
            batch.tensors["ref_log_prob"] = out["ref_log_prob"][index]
        batch.tensors.update({k: v for k, v in sent.tensors.items() if k != "kept_row"})
        _log.info("update.kept_rows", key=kept.key, rows=len(index))
        return batch
