"""Colocated rollout (hybrid engine): RolloutService served from the actor's own weights.

The rollout worker wraps the actor's policy module itself: generation always sees the
current weights, with no copy and no sync step. Both share one WorkerThread, so a
generation never overlaps an update. (Resharding to a different generation TP layout
belongs to the Megatron-sharded roles issue.)
"""
from __future__ import annotations

from services.actor.worker import ActorWorker
from tandem.rollout.servicer import RolloutServicer
from tandem.rollout.worker import RolloutWorker
from tandem.rpc.worker_thread import WorkerThread


def colocated_rollout(actor: ActorWorker, thread: WorkerThread, tokenizer, max_batch_size: int) -> RolloutServicer:
    worker = RolloutWorker(actor.policy, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                           vocab_size=actor.vocab_size, max_batch_size=max_batch_size)
    return RolloutServicer(worker, thread, allow_load_weights=False)
