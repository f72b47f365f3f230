"""The asynchronous loop (controller/async_loop.py) on stand-in phases with a slowed consumer: the
staleness bound holds for every trained batch, the dropped count is exactly the batches that were
too stale, a weight sync never overlaps an update, and staleness 0 is the synchronous schedule."""
import asyncio

import pytest

from tandem.algos import metrics as M
from tandem.controller.async_loop import AsyncLoop, Bounds

STEPS = 12


class SlowConsumer:
    """Generation fast, updates slow; records every batch's stamp and the version it trained at."""

    def __init__(self, gen_s=0.001, update_s=0.02, sync_s=0.002):
        self.gen_s, self.update_s, self.sync_s = gen_s, update_s, sync_s
        self.actor_version = self.rollout_version = 0
        self.updating = False
        self.started: list[int] = []  # seqs whose generation began
        self.generated: list[tuple[int, int]] = []  # (seq, rollout version), in generation order
        self.trained: list[tuple[int, int, int]] = []  # (seq, stamp, actor version at the update)

    async def generate(self, drawn):
        self.started.append(drawn.seq)
        await asyncio.sleep(self.gen_s)
        self.generated.append((drawn.seq, self.rollout_version))
        if drawn.replay:  # a regenerated batch draws its own prompts again (controller/async_train.py)
            drawn.indices, drawn.replay = drawn.indices + drawn.replay, []
        else:
            drawn.indices.append(drawn.seq)  # a new batch: prompt "seq" from the data
        return {"seq": drawn.seq}, {}

    async def sync(self):
        assert not self.updating, "a weight sync overlapped an update"
        await asyncio.sleep(self.sync_s)
        assert not self.updating, "an update started during a weight sync"
        self.rollout_version = self.actor_version
        return self.rollout_version, {M.ROLLOUT_WEIGHTS_VERSION: float(self.rollout_version)}

    async def train(self, batch, step, metrics, update_guard):
        assert batch.data["seq"] == batch.drawn.seq
        self.trained.append((batch.drawn.seq, batch.version, self.actor_version))
        async with update_guard:
            self.updating = True
            await asyncio.sleep(self.update_s)
            self.actor_version += 1
            self.updating = False
        return self.actor_version


def run_loop(phases, bounds):
    loop = AsyncLoop(phases, bounds, version=0)
    logged = []

    async def after_step(step, metrics):
        logged.append((step, metrics))

    asyncio.run(loop.run(1, STEPS, after_step))
    assert [s for s, _ in logged] == list(range(1, STEPS + 1))
    return loop, logged


@pytest.mark.parametrize("staleness,max_ahead", [(1, 1), (1, 3), (2, 3)])
def test_wait_never_trains_stale_and_drops_nothing(staleness, max_ahead):
    phases = SlowConsumer()
    loop, logged = run_loop(phases, Bounds(staleness, max_ahead, "wait"))
    assert [seq for seq, _, _ in phases.trained] == list(range(1, STEPS + 1))  # every batch, in order
    worst = max(at - stamp for _, stamp, at in phases.trained)
    assert worst == min(staleness, max_ahead)  # the consumer is slow: the bound is reached, never passed
    assert loop.dropped == 0 and logged[-1][1][M.ASYNC_DROPPED_BATCHES] == 0
    for (_, metrics), (_, stamp, at) in zip(logged, phases.trained):
        assert metrics[M.ASYNC_STALENESS_MAX] == at - stamp == metrics[M.ASYNC_STALENESS_MEAN]
    assert sum(m[M.ASYNC_PRODUCER_IDLE] for _, m in logged) > 0  # it waited for the slow consumer


def test_staleness_zero_is_the_synchronous_schedule():
    phases = SlowConsumer()
    _, logged = run_loop(phases, Bounds(0, 2, "wait"))
    assert [(seq, stamp, at) for seq, stamp, at in phases.trained] == [(k, k - 1, k - 1) for k in range(1, STEPS + 1)]
    assert all(m[M.ASYNC_QUEUE_DEPTH] == 0 for _, m in logged)


def test_drop_counts_exactly_the_stale_batches():
    phases = SlowConsumer()
    loop, logged = run_loop(phases, Bounds(1, 3, "drop"))
    stamp = dict(phases.generated)
    trained = {seq: at for seq, _, at in phases.trained}
    assert all(at - s <= 1 for _, s, at in phases.trained)
    last = max(trained)
    dropped = [seq for seq, _ in phases.generated if seq < last and seq not in trained]
    assert dropped, "three batches ahead of a slow consumer with a bound of 1 must drop some"
    for seq in dropped:  # the actor's version when it was dropped: that of the next batch trained
        at_drop = trained[min(s for s in trained if s > seq)]
        assert at_drop - stamp[seq] > 1
    assert loop.dropped == len(dropped) == logged[-1][1][M.ASYNC_DROPPED_BATCHES]
    pending = {d.seq for d in loop.pending()}  # in flight at the end (the last one may not have begun)
    assert {seq for seq in phases.started if seq > last} <= pending and len(pending) <= 3 + 1
    assert min(pending) > last


def test_regenerate_loses_no_prompts():
    phases = SlowConsumer()
    loop, _ = run_loop(phases, Bounds(1, 3, "regenerate"))
    trained = [seq for seq, _, _ in phases.trained]
    assert len(set(trained)) == len(trained) == STEPS
    assert all(at - s <= 1 for _, s, at in phases.trained)
    regenerated = {seq for seq, _ in phases.generated if [g for g, _ in phases.generated].count(seq) > 1}
    assert loop.dropped > 0 and regenerated
    pending = {d.seq for d in loop.pending()}
    seen = set(phases.started)
    assert seen <= set(trained) | pending  # every batch started is trained or still pending
    assert not set(trained) & pending and len(pending - seen) <= 1  # at most one reserved, not yet begun
    assert all(d.indices + d.replay == [d.seq] for d in loop.pending() if d.seq in seen)  # with its prompts


def test_a_failing_producer_ends_the_run():
    class Broken(SlowConsumer):
        async def generate(self, drawn):
            raise RuntimeError("rollout gone")

    with pytest.raises(RuntimeError, match="rollout gone"):
        run_loop(Broken(), Bounds(1, 1, "wait"))
