"""Actor service: policy + reference (+ the colocated rollout). `python -m services.actor`.

With services.actor.world_size > 1 this process is rank 0 (the front door) and starts the
other ranks; they build the same workers and follow rank 0's commands.
"""
from __future__ import annotations

from services.actor import hybrid
from services.actor.front import ActorFront
from services.actor.servicer import SERVICE, ActorServicer
from services.actor.worker import ActorWorker
from tandem.models.shape_from_config import model_shape
from tandem.parallel.layout import ParallelConfig
from tandem.serving.process import init_service, load_tokenizer, parse_args, serve_group
from tandem.serving.rank_group import RankGroup
from tandem.serving.rollout_front import RolloutFront
from tandem.serving.rollout_servicer import SERVICE as ROLLOUT_SERVICE
from tandem.serving.rollout_servicer import RolloutServicer


def main(argv=None) -> None:
    args = parse_args("actor", argv)
    cfg = args.cfg
    m = cfg.actor_rollout_ref.actor.megatron
    tokenizer = load_tokenizer(cfg)
    init_service("actor", args, cfg.services.actor.torch_threads, m.seed,
                 parallel=ParallelConfig.of(m),
                 world_size=cfg.services.actor.world_size,
                 shape=model_shape(cfg.actor_rollout_ref.model, len(tokenizer)),
                 gpu_memory_fraction=cfg.services.actor.gpu_memory_fraction)
    worker = ActorWorker(cfg, len(tokenizer))
    colocated = cfg.actor_rollout_ref.rollout.mode == "colocated"
    targets = {"actor": worker}
    if colocated:
        rollout = cfg.actor_rollout_ref.rollout
        targets["rollout"] = hybrid.colocated_rollout_worker(
            worker, tokenizer, rollout.max_batch_size, rollout.free_cache_engine,
            rollout.tensor_model_parallel_size)
    group = RankGroup(targets)

    def servicers(thread):
        out = [(SERVICE, ActorServicer(ActorFront(group, worker), thread))]
        if colocated:  # one thread for both: a generation never overlaps an update
            out.append((ROLLOUT_SERVICE, RolloutServicer(RolloutFront(group, worker.vocab_size, tokenizer.pad_token_id),
                                                         thread)))
        return out

    serve_group("actor", args, group, servicers)


if __name__ == "__main__":
    main()
