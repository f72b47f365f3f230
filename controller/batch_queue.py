"""What the asynchronous loop's producer hands its consumer: scored batches stamped with the
weights version that generated them, in a bounded FIFO queue.

A `Drawn` is a batch's identity: its number in the run (`seq`, which also seeds its sampling, as
the step number does in a synchronous run) and the training prompts drawn for it, in draw order.
A checkpoint saves the `Drawn` of every batch not yet trained; a resumed run draws the same
prompts again from `replay` (the in-flight batches are regenerated, not saved).

Deliberately not here: when to produce, sync or drop (controller/async_loop.py).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class Drawn:
    seq: int  # the batch's number in the run: its sampling seed, its step when no batch is dropped
    indices: list[int] = field(default_factory=list)  # training prompts drawn for it so far
    replay: list[int] = field(default_factory=list)  # prompts to draw again before the data cursor's

    def to_state(self) -> dict:
        return {"seq": self.seq, "indices": self.indices + self.replay}

    @classmethod
    def from_state(cls, state: dict) -> Drawn:
        return cls(int(state["seq"]), replay=[int(i) for i in state["indices"]])

    def again(self) -> Drawn:
        """The same batch, to be generated again from its prompts (on newer weights)."""
        return Drawn(self.seq, replay=self.indices + self.replay)


@dataclass
class StampedBatch:
    drawn: Drawn
    data: object  # the scored generation (a DataProto)
    version: int  # the weights version the rollout generated it with
    metrics: dict[str, float]  # the producer's: timing_s/gen, the sync before it, sampling counts


class BatchQueue:
    """A FIFO of StampedBatch holding at most `capacity`; put waits while it is full."""

    def __init__(self, capacity: int):
        self._queue: asyncio.Queue[StampedBatch] = asyncio.Queue(maxsize=capacity)

    async def put(self, batch: StampedBatch) -> None:
        await self._queue.put(batch)

    async def get(self) -> StampedBatch:
        return await self._queue.get()

    def depth(self) -> int:
        return self._queue.qsize()

