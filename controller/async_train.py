"""A run's RL steps with generation overlapping training (async_training.mode != sync).

Binds controller/async_loop.py to a Run: the producer generates and scores with
controller/step.py's phase 1 on the standalone rollout (seeded by the batch's number, as a
synchronous step is by its step), syncs with `Roles.sync_rollout`; the consumer trains with the
step's phases 2-4 (`step.train_on`), then logs, validates and checkpoints on the run's cadence.

Validation pauses the producer and syncs the rollout to the actor's weights first (it measures
the policy being trained). A checkpoint saves, with the data cursor, every batch not yet trained
(its number and prompts: data_cursor.async_pending) and the next batch number; a resumed run generates
those batches again from the same prompts, on the restored weights, before drawing new prompts.
In-flight generations are so regenerated rather than saved: no step's data is lost or trained
twice, but a regenerated batch is sampled on the restored (newer) weights, so a resumed async run
is not bit-identical to an uninterrupted one.

Deliberately not here: the loop itself (controller/async_loop.py), the phases (controller/step.py).
"""
from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from tandem.algos import metrics as M
from tandem.config import TandemConfig
from tandem.controller import checkpointing
from tandem.controller.async_loop import AsyncLoop, Bounds
from tandem.controller.batch_queue import Drawn, StampedBatch
from tandem.controller.data import collate
from tandem.controller.step import StepContext, nothing_to_train, rollout_and_score, train_on
from tandem.controller.step_metrics import perf_metrics
from tandem.data.batch import DataProto


def bounds_of(cfg: TandemConfig) -> Bounds:
    """one_step_off: one batch generated ahead, staleness 1, never dropped (verl's recipe)."""
    a = cfg.async_training
    if a.mode == "one_step_off":
        return Bounds(staleness=1, max_ahead=1, on_stale="wait")
    return Bounds(staleness=a.staleness_threshold, max_ahead=a.max_inflight_batches, on_stale=a.on_stale)


class RunPhases:
    """The loop's phases on a Run's services, data and cadence."""

    def __init__(self, run):
        self.run = run
        self.ctx = StepContext(run.roles, run.cfg, run.tokenizer, run.kl_ctrl)
        self.t_last = time.perf_counter()

    def draw(self, drawn: Drawn, k: int) -> DataProto:
        """k prompts for `drawn`: first those it must draw again, then the data cursor's."""
        again, drawn.replay = drawn.replay[:k], drawn.replay[k:]
        indices = again + (self.run.cursor.next(k - len(again)) if k > len(again) else [])
        drawn.indices.extend(indices)
        return collate([self.run.train[i] for i in indices], self.run.tokenizer.pad_token_id)

    async def generate(self, drawn: Drawn) -> tuple[DataProto, dict[str, float]]:
        metrics: dict[str, float] = {}  # timing_s/gen and timing_s/reward (+ DAPO's counts)
        gen, _ = await rollout_and_score(self.ctx, lambda k: self.draw(drawn, k), drawn.seq, metrics,
                                         start_phase2=False)  # log-probs on the weights that train it
        return gen, metrics

    async def sync(self) -> tuple[int, dict[str, float]]:
        metrics = await self.run.roles.sync_rollout()
        return int(metrics[M.ROLLOUT_WEIGHTS_VERSION]), metrics

    async def train(self, batch: StampedBatch, step: int, metrics: dict[str, float],
                    update_guard: AbstractAsyncContextManager) -> int | None:
        self.run.roles.set_step(step)
        if nothing_to_train(batch.data, step, metrics):
            return None
        version = await train_on(self.ctx, batch.data, step, metrics, update_guard)
        if version is not None:  # export the new version now, while the actor is idle: the producer's
            await self.run.roles.actor.weights_version()  # sync then does not queue behind the next log-probs
        metrics.update(perf_metrics(batch.data, self.t_last, self.ctx.n_gpus))  # since the last step's end, waits included
        return version


async def train_async(run) -> None:
    """The RL steps after the last one done, overlapped; the rollout ends synced to the actor."""
    t, phases = run.cfg.trainer, RunPhases(run)
    state = checkpointing.read_state(run.resume_from)["data_cursor"] if run.resume_from else {}
    loop = AsyncLoop(phases, bounds_of(run.cfg), await run.roles.actor.weights_version(),
                     next_seq=int(state.get("async_next_seq", run.steps.done + 1)),
                     replay=[Drawn.from_state(d) for d in state.get("async_pending", [])])
    run.cursor = PendingCursor(run.cursor, loop)  # every checkpoint from here on, the final one too

    async def after_step(step: int, metrics: dict) -> None:
        @asynccontextmanager
        async def validating():  # the producer paused, the rollout on the weights being validated
            async with loop.paused(), loop.weights_lock:
                if loop.rollout_version != loop.actor_version:
                    metrics.update(await loop.sync_locked())
                yield

        await run.after_step(step, metrics, validating)
        phases.t_last = time.perf_counter()  # timing_s/step: validation and checkpoints left out, as in sync

    t0 = time.time()
    await loop.run(run.steps.done + 1, t.total_training_steps, after_step)
    await run.roles.sync_rollout()  # the final validation measures the trained policy
    run.summary["rl_time_s"] = time.time() - t0
    run.summary["async_dropped_batches"] = loop.dropped


class PendingCursor:
    """The run's data cursor during an async run: its state (controller_state.json's data_cursor)
    also lists the batches drawn and not yet trained, and the next batch number, so that every
    checkpoint, the run's final one included, lets a resumed run draw them again."""

    def __init__(self, cursor, loop: AsyncLoop):
        self.cursor, self.loop = cursor, loop

    def next(self, n: int) -> list[int]:
        return self.cursor.next(n)

    def state_dict(self) -> dict:
        return {**self.cursor.state_dict(), "async_pending": [d.to_state() for d in self.loop.pending()],
                "async_next_seq": self.loop.next_seq}

    def load_state_dict(self, state: dict) -> None:
        self.cursor.load_state_dict(state)
