"""Phase 2 of a step (controller/step.py): the old and reference log-probs of the step's rows, in
one actor call, and the critic's values, started as soon as the rows exist, while the reward
service scores them (neither needs the scores).

Rows a colocated rollout generated are the actor's own: it kept them and queued this very pass
behind the generation, and every call names them by their key (clients.KeptRows). Scoring may drop
rows (reward_model.on_failure=drop): `pick` names the rows left, for this phase's results and for
the update. The actor leaves out of the pass the rows its update trains on the weights that
generated them (`before_update`): the update's own forward gives their old log-probs, and they come
back with the update (controller/step.py fills them in).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import torch

from tandem.algos import metrics as M
from tandem.controller.clients import KeptRows, Rows
from tandem.controller.step_context import StepContext
from tandem.controller.step_timing import timed_await
from tandem.data.batch import DataProto
from tandem.rollout.outputs import step_rows


@dataclass
class LogProbs:
    """Phase 2's outputs, one row per row the step trains on."""

    old: DataProto  # old_log_probs [B, R] (0 in rows the update computes; it fills them in)
    ref: DataProto | None  # ref_log_prob [B, R], when KL is in the loss or the reward
    values: DataProto | None  # values [B, R], with a critic


def sequences(gen: DataProto, ctx: StepContext) -> DataProto:
    """The generated rows as the actor and critic take them."""
    return step_rows(gen, ctx.cfg.actor_rollout_ref.rollout.temperature, ctx.n)


def keep_settings(ctx: StepContext, step: int) -> dict:
    """GenerateSequences' `keep` for a colocated rollout: this phase's actor call, queued behind the
    generation."""
    return {"with_reference": ctx.need_ref, "before_update": ctx.update_follows(step)}


class Phase2:
    """The log-prob and value calls of one step's rows, running from construction."""

    def __init__(self, ctx: StepContext, gen: DataProto, step: int, timings: dict[str, float]):
        self.seq = sequences(gen, ctx)
        self.kept = gen.meta.pop("kept_rows", "")  # the colocated actor holds the rows
        self.picked: torch.Tensor | None = None  # the rows scoring left (None: all)
        self.task = asyncio.ensure_future(self._run(ctx, step, timings))

    def pick(self, rows: torch.Tensor | None) -> None:
        """Scoring kept only `rows` (increasing row numbers; None: every row)."""
        self.picked = rows

    def rows(self) -> Rows:
        """The step's rows as the actor's calls name them: the kept key and the rows picked, or the rows."""
        if self.kept:
            return KeptRows(self.kept, None if self.picked is None else self.picked.tolist())
        return self.sequences()

    def sequences(self) -> DataProto:
        """The rows picked, as the actor and critic take them."""
        return self._picked(self.seq)

    def _picked(self, batch: DataProto | None) -> DataProto | None:
        return batch if batch is None or self.picked is None else batch.index(self.picked)

    async def _run(self, ctx: StepContext, step: int, timings: dict[str, float]) -> LogProbs:
        rows = KeptRows(self.kept) if self.kept else self.seq
        t0 = time.perf_counter()
        (old, _), values = await asyncio.gather(
            ctx.roles.actor.compute_log_prob(rows, with_reference=ctx.need_ref, before_update=ctx.update_follows(step)),
            timed_await(ctx.roles.critic.compute_values(self.seq) if ctx.use_critic else None, timings,
                        M.TIMING_VALUES))
        for key in (M.TIMING_OLD_LOG_PROB,) + ((M.TIMING_REF,) if ctx.need_ref else ()):  # one call: both its own
            timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        ref = DataProto(tensors={"ref_log_prob": old.tensors.pop("ref_log_prob")}) if ctx.need_ref else None
        return LogProbs(old, ref, values)

    async def result(self) -> LogProbs:
        """The results for the rows picked."""
        lp = await self.task
        return LogProbs(*(self._picked(x) for x in (lp.old, lp.ref, lp.values)))

    def cancel(self) -> None:
        self.task.cancel()
