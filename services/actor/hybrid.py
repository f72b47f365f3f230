"""Colocated rollout (hybrid engine): RolloutService served from the actor's own weights.

On every rank the rollout worker wraps that rank's shard of the policy module itself:
generation always sees the current weights, with no copy and no sync step, at the
training TP layout. Rank 0 serves both services from one WorkerThread, so a generation
never overlaps an update. With actor_rollout_ref.rollout.free_cache_engine the KV cache (and
its CUDA graphs) is freed after each generation, so training gets that memory back.
With actor_rollout_ref.rollout.tensor_model_parallel_size=1 and a TP > 1 or PP > 1 actor, each rank
generates instead on a TP=1 copy synced from the training shards before every generation
(tandem/rollout/replica.py: verl's hybrid-engine resharding).
"""
from __future__ import annotations

from tandem.services.actor.worker import ActorWorker

from tandem.rollout.replica import ReplicaRollout
from tandem.rollout.worker import RolloutWorker


def colocated_rollout_worker(actor: ActorWorker, tokenizer, max_batch_size: int, free_cache_engine: bool,
                             generation_tp: int | None = None) -> RolloutWorker | ReplicaRollout:
    m = actor.actor_cfg.megatron
    if generation_tp == 1 and (m.tensor_model_parallel_size > 1 or m.pipeline_model_parallel_size > 1):
        return ReplicaRollout(actor, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                              max_batch_size=max_batch_size, free_cache_engine=free_cache_engine)
    return RolloutWorker(actor.policy, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                         vocab_size=actor.vocab_size, max_batch_size=max_batch_size,
                         free_cache_engine=free_cache_engine)
