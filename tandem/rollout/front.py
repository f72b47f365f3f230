"""RolloutWorker's API over a rank group (rank 0 = front door).

Prompts are split over the DP ranks in contiguous shards (TP ranks of one DP group
generate together); the shards' outputs concatenate back in order. Used by the standalone
rollout service and by the actor's colocated rollout.
"""
from __future__ import annotations

from dataclasses import replace

from tandem.data.batch import DataProto
from tandem.dist.dispatch import layout
from tandem.dist.rank_group import RankGroup
from tandem.generation.sampling import SamplingParams


class RolloutFront:
    def __init__(self, group: RankGroup, vocab_size: int, target: str = "rollout"):
        self.group = group
        self.vocab_size = vocab_size
        self.target = target
        self.weights_version = 0

    def generate_sequences(self, batch: DataProto, params: SamplingParams) -> DataProto:
        lay = layout(batch, len(batch), self.group.dp_size)
        args = []
        for dp, shards in enumerate(lay.shards):
            seeded = params if params.seed is None else replace(params, seed=params.seed + dp)
            args.append(None if shards[0] is None else (shards[0], seeded))
        parts = [p for p in self.group.run(self.target, "generate_sequences", args) if p is not None]
        return DataProto.concat(parts) if len(parts) > 1 else parts[0]

    def load_weights(self, weights, version: int) -> int:
        self.weights_version = self.group.run_all(self.target, "load_weights", weights, version)[0]
        return self.weights_version
