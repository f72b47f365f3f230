"""RolloutWorker's API over a rank group (rank 0 = front door; tandem/serving/front.py).

Prompts are split over the DP ranks in contiguous shards (TP ranks of one DP group
generate together), or over every rank for TP=1 replicas (tandem/rollout/replica.py); the
shards' outputs concatenate back in order. Every shard samples
with the request's seed and its rows' global numbers (the request's row_offset, set when the
controller splits a batch over rollout replicas, plus the shard's offset), so the tokens do
not depend on the DP size or the replica count. Used by the standalone
rollout service and by the actor's colocated rollout.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from tandem.data.batch import DataProto
from tandem.generation.sampling import SamplingParams
from tandem.rollout.outputs import concat_generations
from tandem.serving.dispatch import layout
from tandem.serving.rank_group import RankGroup


class RolloutFront:
    def __init__(self, group: RankGroup, vocab_size: int, pad_id: int, target: str = "rollout"):
        self.group = group
        self.vocab_size = vocab_size
        self.pad_id = pad_id
        self.target = target

    def generate_sequences(self, batch: DataProto, params: SamplingParams) -> DataProto:
        every_rank = getattr(self.group.targets.get(self.target), "every_rank", False)
        lay = layout(batch, len(batch), self.group.world if every_rank else self.group.dp_size)
        if params.seed is None:  # one seed for all shards, so that rows do not depend on the DP split
            params = replace(params, seed=int(torch.randint(0, 2**31, ()).item()))
        args, first = [], 0
        for shards in lay.shards:
            shard = shards[0]
            if shard is None:  # a replica with no prompts still joins the weight gather
                args.append((None, params) if every_rank else None)
                continue
            args.append((shard, replace(params, row_offset=params.row_offset + first * params.n)))
            first += len(shard)
        run = self.group.run_ranks if every_rank else self.group.run
        parts = [p for p in run(self.target, "generate_sequences", args) if p is not None]
        return concat_generations(parts, self.pad_id)  # each rank padded its prompts to its own longest
