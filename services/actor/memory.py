"""The actor's memory phases: what each of its calls needs on the device (tandem/train/phases.py).

Groups and their keys: `policy` (actor.megatron.param_offload), `grads` (grad_offload),
`optimizer` (optimizer_offload: the RL and SFT optimizers' fp32 main weights and Adam moments),
`ref` (ref.megatron.param_offload) and, colocated, `kv_cache` (rollout.free_cache_engine;
services/actor/hybrid.py adds it). In a colocated step (generate -> old and reference log-probs ->
update) the policy is used by every phase but the reference's, so `param_offload` moves it out
only while the reference computes (and, standalone, between calls); the optimizer state and the
gradient buffers leave when generation starts and come back when training starts.
"""
from __future__ import annotations

from tandem.train.phases import MemoryPhases, grads_group, optimizer_group, params_group

ACTOR_PHASES = {
    "generate": {"policy", "kv_cache"},  # colocated generation runs on the policy's own weights
    "log_probs": {"policy"},
    "ref_log_probs": {"ref"},
    "train": {"policy", "grads", "optimizer"},
    "weights": {"policy"},  # export for a standalone rollout or Hugging Face
    "checkpoint": {"policy", "ref", "optimizer"},  # save, load, reference := policy
}
READS_ONLY = {"ref_log_probs": {"ref"}}  # the reference's weights change only in `checkpoint`


def actor_memory(worker) -> MemoryPhases:
    """The phases of an ActorWorker (its policy, ddp, ref and optimizers built). A standalone
    actor shares its GPU with nothing in its process but may with the rollout service: it goes
    idle after each call (verl's behaviour); a colocated one keeps what the next call may use."""
    cfg = worker.cfg.actor_rollout_ref
    m = cfg.actor.megatron
    memory = MemoryPhases(ACTOR_PHASES, idle_after_call=cfg.rollout.mode == "standalone", reads_only=READS_ONLY)
    memory.add(params_group("policy", worker.policy, m.param_offload))
    memory.add(grads_group(worker.ddp, m.grad_offload))
    memory.add(optimizer_group(lambda: [o for o in (worker.optimizer, worker.sft_optimizer) if o is not None],
                               worker.policy, m.optimizer_offload))
    memory.add(params_group("ref", worker.ref, cfg.ref.megatron.param_offload))
    return memory
