"""Colocated rollout (hybrid engine): RolloutService served from the actor's own weights.

On every rank the rollout worker wraps that rank's shard of the policy module itself:
generation always sees the current weights, with no copy and no sync step, at the
training TP layout. Rank 0 serves both services from one WorkerThread, so a generation
never overlaps an update. With actor_rollout_ref.rollout.tensor_model_parallel_size=1 and a TP > 1 or PP > 1 actor, each rank
generates instead on a TP=1 copy synced from the training shards before every generation
(tandem/rollout/replica.py: verl's hybrid-engine resharding).

Memory (services/actor/memory.py): every generation enters the actor's `generate` phase, so the
optimizer state and gradient buffers leave the GPU first when their offload keys are on, and
the engine's KV cache is a state group of the actor: with rollout.free_cache_engine it (and the
engine's CUDA graphs) is freed when the next non-generation call starts, and allocated again by
the next generation. The engine's CUDA graphs point at the policy's parameter storage, so before
the policy's parameters move to host memory (actor.megatron.param_offload, while the reference
computes) the engine is released; the next generation captures again.
"""
from __future__ import annotations

from tandem.data.batch import DataProto
from tandem.generation.multi_turn import MultiTurn
from tandem.generation.sampling import SamplingParams
from tandem.rollout.replica import ReplicaRollout
from tandem.rollout.worker import RolloutWorker
from tandem.services.actor.worker import ActorWorker
from tandem.train.phases import StateGroup


class ColocatedRollout:
    """The actor process's rollout target: the engine's generation inside the actor's `generate` phase."""

    def __init__(self, actor: ActorWorker, engine: RolloutWorker | ReplicaRollout, free_cache_engine: bool):
        self.actor = actor
        self.engine = engine
        self.every_rank = getattr(engine, "every_rank", False)  # read by RolloutFront
        cache = actor.memory.groups.get("kv_cache") or actor.memory.add(
            StateGroup("kv_cache", free_cache_engine, move_out=lambda: None, move_in=lambda: None))
        cache.before_out.append(engine.release)  # the engine allocates again when it next generates
        if isinstance(engine, RolloutWorker):  # its graphs hold the policy's own storage
            actor.memory.groups["policy"].before_out.append(engine.release)

    def generate_sequences(self, batch: DataProto | None, params: SamplingParams) -> DataProto | None:
        with self.actor.memory.phase("generate"):
            return self.engine.generate_sequences(batch, params)


def colocated_rollout_worker(actor: ActorWorker, tokenizer, max_batch_size: int, free_cache_engine: bool,
                             generation_tp: int | None = None, tools: MultiTurn | None = None) -> ColocatedRollout:
    m = actor.actor_cfg.megatron
    if generation_tp == 1 and (m.tensor_model_parallel_size > 1 or m.pipeline_model_parallel_size > 1):
        engine = ReplicaRollout(actor, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                                max_batch_size=max_batch_size, free_cache_engine=False, tools=tools)
    else:
        engine = RolloutWorker(actor.policy, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                               vocab_size=actor.vocab_size, max_batch_size=max_batch_size, tools=tools)
    return ColocatedRollout(actor, engine, free_cache_engine)  # the cache is freed by the actor's phases
