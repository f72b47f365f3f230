"""Asynchronous RL: a producer (weight sync + generation + scoring) and a consumer (log-probs,
advantages, update) joined by a bounded queue of scored batches, with a bound on staleness.

A batch's staleness is the number of actor updates between the weights that generated it and the
update that trains on it. Batches are trained in the order they were produced, so a batch started
now on rollout weights `w` will be trained at actor version `actor_version + ahead - w` later, where
`ahead` counts the batches started before it and not yet trained or dropped (the one being
trained included). The producer starts a batch only while `ahead <= max_ahead`, and:
- on_stale=wait (AReaL's admission): also only while `ahead <= staleness`, and syncs first when
  the rollout's weights would otherwise make it stale: no batch is ever stale, none is dropped;
- on_stale=drop | regenerate: runs ahead; the consumer drops a batch staler than the bound
  (counted) or hands its prompts back to be generated again on newer weights.

Weight syncs happen between two generations, in the producer: a generation in flight finishes on
the weights it started with and is stamped with them (no interrupted sequences: every row of a
batch has one behaviour policy, whose log-probs the rollout returned). An update and a sync never
overlap (`weights_lock`: a transfer overlapping an update is torn, tandem/weights/source.py); when
an update is running the producer syncs only if the bound needs it, otherwise it generates on the
weights it has and syncs before a later batch.

Deliberately not here: what generating, syncing and training do (controller/async_train.py binds
them to a run's services and the phases of controller/step.py).
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from tandem.algos import metrics as M
from tandem.controller.batch_queue import BatchQueue, Drawn, StampedBatch


class Phases(Protocol):
    async def generate(self, drawn: Drawn) -> tuple[object, dict[str, float]]:
        """The scored generation of `drawn` (prompts drawn into it) -> (batch, metrics)."""

    async def sync(self) -> tuple[int, dict[str, float]]:
        """Every rollout pulls the actor's current weights -> (their version, the sync's metrics)."""

    async def train(self, batch: StampedBatch, step: int, metrics: dict[str, float],
                    update_guard: AbstractAsyncContextManager) -> int | None:
        """Log-probs, advantages, update (holding `update_guard`) -> the actor's version after it
        (None: nothing was trained)."""


@dataclass(frozen=True)
class Bounds:
    staleness: int  # versions a trained batch may be behind the actor
    max_ahead: int  # batches started ahead of the one being trained
    on_stale: str  # wait | drop | regenerate


class AsyncLoop:
    """One run's producer and consumer. `after_step(step, metrics)` runs on the consumer after
    each trained step (logging, validation, checkpoints); it may pause the producer (`paused`)."""

    def __init__(self, phases: Phases, bounds: Bounds, version: int, next_seq: int = 1,
                 replay: list[Drawn] | None = None):
        self.phases, self.bounds = phases, bounds
        self.actor_version = self.rollout_version = version
        self.next_seq = next_seq
        self.queue = BatchQueue(bounds.max_ahead)
        self.weights_lock = asyncio.Lock()  # an update or a weight sync, never both
        self.rollout_lock = asyncio.Lock()  # the producer's sync + generation; validation pauses it
        self.changed = asyncio.Condition()  # the consumer finished a batch: ahead and versions moved
        self.inflight: dict[int, Drawn] = {}  # started, not yet trained or dropped
        self.regen: deque[Drawn] = deque(replay or [])
        self.ahead = 0
        self.dropped = 0
        self.idle = {"producer": 0.0, "consumer": 0.0}  # seconds since the last step

    # ---- the producer ----------------------------------------------------------------------

    def _may_start(self) -> bool:
        b = self.bounds
        return self.ahead <= (min(b.max_ahead, b.staleness) if b.on_stale == "wait" else b.max_ahead)

    def _predicted(self, version: int) -> int:
        """Staleness of a batch started now (already counted in `ahead`) on weights `version`."""
        return self.actor_version + self.ahead - 1 - version

    async def _produce(self) -> None:
        while True:
            t0 = time.perf_counter()
            async with self.changed:
                await self.changed.wait_for(self._may_start)
            drawn = self.regen.popleft() if self.regen else self._new_drawn()
            self.inflight[drawn.seq] = drawn
            self.ahead += 1
            async with self.rollout_lock:
                self.idle["producer"] += time.perf_counter() - t0
                metrics = await self._sync_if_due()
                data, gen_metrics = await self.phases.generate(drawn)  # timing_s/gen among them
                metrics.update(gen_metrics)
                version = self.rollout_version
            await self.queue.put(StampedBatch(drawn, data, version, metrics))

    def _new_drawn(self) -> Drawn:
        self.next_seq += 1
        return Drawn(self.next_seq - 1)

    async def _sync_if_due(self) -> dict[str, float]:
        """Sync before this generation when there is a newer version and no update runs; when an
        update runs, wait for it only if the bound needs the newer weights (on_stale=wait)."""
        if self.rollout_version >= self.actor_version:
            return {}
        needed = self.bounds.on_stale == "wait" and self._predicted(self.rollout_version) > self.bounds.staleness
        if self.weights_lock.locked() and not needed:
            return {}
        t0 = time.perf_counter()
        async with self.weights_lock:
            self.idle["producer"] += time.perf_counter() - t0
            return await self.sync_locked()

    async def sync_locked(self) -> dict[str, float]:
        """A sync to the actor's current version (the caller holds weights_lock)."""
        self.rollout_version, metrics = await self.phases.sync()
        return metrics

    def paused(self) -> AbstractAsyncContextManager:
        """No generation or sync by the producer while held (its in-flight one finishes first)."""
        return self.rollout_lock

    # ---- the consumer ----------------------------------------------------------------------

    async def _consume(self, first_step: int, last_step: int,
                       after_step: Callable[[int, dict], Awaitable[None]]) -> None:
        step = first_step
        while step <= last_step:
            t0 = time.perf_counter()
            batch = await self.queue.get()
            self.idle["consumer"] += time.perf_counter() - t0
            staleness = self.actor_version - batch.version
            if staleness > self.bounds.staleness:
                self.dropped += 1
                await self._finish(batch.drawn, None, again=self.bounds.on_stale == "regenerate")
                continue
            metrics = {**batch.metrics, M.ASYNC_BATCH: float(batch.drawn.seq), M.ASYNC_QUEUE_DEPTH: float(self.queue.depth()),
                       M.ASYNC_STALENESS_MEAN: float(staleness), M.ASYNC_STALENESS_MAX: float(staleness)}
            version = await self.phases.train(batch, step, metrics, self.weights_lock)
            await self._finish(batch.drawn, version)
            metrics.update({M.ASYNC_DROPPED_BATCHES: float(self.dropped), M.ASYNC_PRODUCER_IDLE: self.idle["producer"],
                            M.ASYNC_CONSUMER_IDLE: self.idle["consumer"]})
            self.idle = {"producer": 0.0, "consumer": 0.0}
            await after_step(step, metrics)
            step += 1

    async def _finish(self, drawn: Drawn, version: int | None, again: bool = False) -> None:
        async with self.changed:
            if version is not None:
                self.actor_version = version
            del self.inflight[drawn.seq]
            self.ahead -= 1
            if again:
                self.regen.append(drawn.again())
            self.changed.notify_all()

    def pending(self) -> list[Drawn]:
        """Every batch started or due again and not yet trained, by seq: what a checkpoint saves."""
        return sorted([*self.inflight.values(), *self.regen], key=lambda d: d.seq)

    # ---- both ------------------------------------------------------------------------------

    async def run(self, first_step: int, last_step: int, after_step: Callable[[int, dict], Awaitable[None]]) -> None:
        """Steps first_step..last_step; the producer stops when the last is done (what it has in
        flight then is discarded). A failure of either side ends both and is raised."""
        producer = asyncio.create_task(self._produce(), name="async-producer")
        consumer = asyncio.create_task(self._consume(first_step, last_step, after_step), name="async-consumer")
        try:
            done, _ = await asyncio.wait({producer, consumer}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # the producer never ends by itself: only its failure gets here
        finally:
            for task in (producer, consumer):
                task.cancel()
            await asyncio.gather(producer, consumer, return_exceptions=True)
