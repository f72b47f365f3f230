"""Phase 2 of a step: old and reference log-probs and the critic's values (controller/step.py).

Started after scoring, or as soon as the rows are generated (EarlyLogProbs: trainer.log_probs_with_scoring;
trainer.log_probs_after_generation, where the colocated actor has queued its pass behind the generation
and keeps the rows: the controller asks for that pass by key).
"""
from __future__ import annotations

import asyncio
import time

import torch

from tandem.algos import metrics as M
from tandem.config import TandemConfig
from tandem.controller.step_context import LogProbs, StepContext
from tandem.controller.step_timing import timed_await
from tandem.data.batch import DataProto
from tandem.logging import get_logger
from tandem.rollout.outputs import step_rows
from tandem.rpc.errors import FailedPrecondition

_log = get_logger("controller.log_probs")


def after_generation(ctx: StepContext) -> bool:
    """trainer.log_probs_after_generation where it applies: the rollout is the actor's own (colocated)."""
    return ctx.cfg.trainer.log_probs_after_generation and not ctx.roles.standalone_rollout


def on_policy_step(ctx: StepContext, rows: int, step: int) -> int:
    """Leading rows whose old log-probs the update's own forward gives (none while the critic warms up)."""
    return ctx.on_policy_rows(rows) if step > ctx.cfg.trainer.critic_warmup else 0


class EarlyLogProbs:
    """trainer.log_probs_with_scoring: phase 2 starts when the rows are generated, while they are
    scored (it does not need the scores); rows scoring drops (reward_model.on_failure=drop) leave
    its results too. Not with DAPO's dynamic sampling (its rows are known after several rounds).
    trainer.log_probs_after_generation (colocated): the actor's pass is queued behind the
    generation itself (`queue_after`) and phase 2 asks for its result (the kept rows)."""

    ROW = "__generated_row__"  # each generated row's number, through scoring's row selection

    def __init__(self, ctx: StepContext, step: int, metrics: dict[str, float]):
        self.ctx, self.step, self.metrics = ctx, step, metrics
        self.task: asyncio.Task | None = None
        self.generated = self.own = 0
        self.kept = ""  # the actor keeps the rows and its pass on them under this key

    def queue_after(self, rows: int) -> dict | None:
        """GenerateSequences' log_probs_after for `rows` generated rows: phase 2's actor call as one
        ComputeLogProb (an old pass, the reference's with it; or the reference's alone when the
        update gives every old log-prob); None when phase 2 makes two actor calls or none."""
        ctx = self.ctx
        own = on_policy_step(ctx, rows, self.step)
        two_calls = own < rows and ctx.need_ref and not ctx.cfg.trainer.log_probs_one_call
        if not after_generation(ctx) or two_calls or (own >= rows and not ctx.need_ref):
            return None
        return {"with_reference": ctx.need_ref, "policy_from_row": min(own, rows)}

    def start(self, gen: DataProto) -> None:
        kept = gen.meta.pop("kept_rows", "")
        if not kept and not self.ctx.cfg.trainer.log_probs_with_scoring:
            return  # nothing was queued: phase 2 runs after scoring (result() is None)
        # fewer rows later: rows computed by the update stay among the first `own` (scoring keeps the order)
        self.own = own = on_policy_step(self.ctx, len(gen), self.step)
        self.kept = kept
        self.task = asyncio.ensure_future(log_probs_and_values(self.ctx, sequences(gen, self.ctx.cfg), self.metrics,
                                                               own=own, kept=kept))
        self.generated = len(gen)
        gen.tensors[self.ROW] = torch.arange(len(gen))

    async def result(self, gen: DataProto) -> LogProbs | None:
        """Phase 2's results for the rows of `gen` that scoring kept (and `gen` without the row
        numbers); None when it was not started early."""
        if self.task is None:
            return None
        lp, rows = await self.task, gen.tensors.pop(self.ROW)
        if len(rows) != self.generated:  # scoring dropped rows (keeping the others' order)
            lp = LogProbs(*(None if x is None else x.index(rows) for x in (lp.old, lp.ref, lp.values)), own=lp.own)
        return lp


def sequences(gen: DataProto, cfg: TandemConfig) -> DataProto:
    """The generated rows as the actor and critic take them."""
    return step_rows(gen, cfg.actor_rollout_ref.rollout.temperature, cfg.actor_rollout_ref.rollout.n)


# ---- phase 2: log-probs and values ----------------------------------------------------------

async def log_probs_and_values(ctx: StepContext, seq: DataProto, timings: dict | None = None,
                               own: int = 0, kept: str = "") -> LogProbs:
    """Old log-probs (but those of the first `own` rows: the update computes them; every row's:
    no pass), reference log-probs and values, concurrently (each timed on its own);
    trainer.log_probs_one_call: old and reference in one actor call (both timings are that call's).
    kept: the actor holds these rows (a generation's kept_rows) and its ComputeLogProb pass on them."""
    actor, critic, timings = ctx.roles.actor, ctx.roles.critic, {} if timings is None else timings
    old_pass = own < len(seq)
    if old_pass and ctx.need_ref and ctx.cfg.trainer.log_probs_one_call:  # one call: both timings are its own
        t0 = time.perf_counter()
        both, values = await asyncio.gather(
            _actor_log_prob(actor, seq, kept, with_reference=True, policy_from_row=own),
            timed_await(critic.compute_values(seq) if ctx.use_critic else None, timings, M.TIMING_VALUES))
        for key in (M.TIMING_OLD_LOG_PROB, M.TIMING_REF):
            timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        if "ref_log_prob" not in both.tensors:  # proto3 drops a field the service does not know
            raise RuntimeError("the actor service returned no ref_log_prob for ComputeLogProb with_reference: it "
                               "predates that field; restart it on this version or set trainer.log_probs_one_call=false")
        ref = DataProto(tensors={"ref_log_prob": both.tensors.pop("ref_log_prob")})
        return LogProbs(both, ref, values, own)
    old, ref, values = await asyncio.gather(
        timed_await(_actor_log_prob(actor, seq, kept, policy_from_row=own) if old_pass else None, timings,
                    M.TIMING_OLD_LOG_PROB),
        timed_await(_reference_log_prob(actor, seq, kept) if ctx.need_ref else None, timings, M.TIMING_REF),
        timed_await(critic.compute_values(seq) if ctx.use_critic else None, timings, M.TIMING_VALUES))
    return LogProbs(old, ref, values, own if old_pass else 0)


async def _actor_log_prob(actor, seq: DataProto, kept: str, **settings) -> DataProto:
    """ComputeLogProb on the kept rows when the actor holds them (its pass may be done already), else on `seq`."""
    if kept:
        try:
            return await actor.kept_log_prob(kept, **settings)
        except FailedPrecondition as e:  # e.g. the actor restarted since the generation: send the rows
            _log.warning("log_probs.kept_rows_gone", reason=str(e))
    return await actor.compute_log_prob(seq, **settings)


async def _reference_log_prob(actor, seq: DataProto, kept: str) -> DataProto:
    """ComputeRefLogProb's answer; from the kept rows' pass (the reference's alone) when there is one."""
    if kept:
        both = await _actor_log_prob(actor, seq, kept, with_reference=True, policy_from_row=len(seq))
        return DataProto(tensors={"ref_log_prob": both["ref_log_prob"]})
    return await actor.compute_ref_log_prob(seq)
