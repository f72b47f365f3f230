"""Colocated generation at TP=1 while the actor trains tensor-parallel (verl's hybrid-engine
resharding, for TP > 1 -> TP = 1).

Every rank of the actor holds a TP=1 copy of the policy (a megatron GPTModel on single-rank
process groups, tandem/models/build.py `replica=True`) and generates its own share of the
prompts, so decode runs without a TP all-reduce per layer, in CUDA graphs and on the fused
step. Before each generation the training shards are gathered into the TP=1 layout
(tandem/convert/reshard.py `tp1_weights`, collective over the TP group) and copied into the
copy's parameters in place (the engine's CUDA graphs keep pointing at them). Costs one full
copy of the weights per rank.
"""
from __future__ import annotations

import torch

from tandem.data.batch import DataProto
from tandem.generation.multi_turn import MultiTurn
from tandem.generation.sampling import SamplingParams
from tandem.rollout.worker import RolloutWorker


class ReplicaRollout:
    """A rollout target on every actor rank: `generate_sequences(None, params)` on a rank with
    no prompts still takes part in the weight gather (every rank is called)."""

    every_rank = True  # RolloutFront: split prompts over all ranks, call every rank

    def __init__(self, actor, *, pad_id: int, eos_id: int, max_batch_size: int, free_cache_engine: bool,
                 tools: MultiTurn | None = None):
        from tandem.models.build import build_gpt_model

        self.actor = actor
        dtype = next(actor.policy.parameters()).dtype
        # every generation first syncs the policy's weights in (strict: all of them)
        self.model = build_gpt_model(actor.shape, params_dtype=dtype, replica=True, weights_follow=True).eval()
        self.model.requires_grad_(False)
        self.worker = RolloutWorker(self.model, pad_id=pad_id, eos_id=eos_id, vocab_size=actor.vocab_size,
                                    max_batch_size=max_batch_size, free_cache_engine=free_cache_engine, tools=tools)
        self.syncs = 0

    def generate_sequences(self, batch: DataProto | None, params: SamplingParams) -> DataProto | None:
        self.sync()
        if batch is None:
            return None
        return self.worker.generate_sequences(batch, params)

    def release(self) -> None:
        """Free the TP=1 copy's KV cache and graphs (the copy itself stays)."""
        self.worker.release()

    @torch.no_grad()
    def sync(self) -> None:
        """The policy's current weights into the TP=1 copy (collective over the actor's TP group)."""
        from tandem.convert.reshard import tp1_weights

        self.syncs += 1
        self.worker.load_weights(tp1_weights(self.actor.policy, self.actor.shape), self.syncs)
