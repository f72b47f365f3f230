"""Actor service: policy + reference (+ the colocated rollout). `python -m tandem.services.actor`.

Long-lived (no --config): waits for LifecycleService.Configure; with --config it takes that
run at start. With services.actor.world_size > 1 this process is rank 0 (the front door) and
starts the other ranks; they build the same workers and follow rank 0's commands.
"""
from __future__ import annotations

from tandem.models.shape_from_config import model_shape
from tandem.parallel.layout import ParallelConfig
from tandem.rollout.tools import multi_turn_from_config
from tandem.services.actor import hybrid
from tandem.services.actor.front import ActorFront
from tandem.services.actor.kept_rows import KeptRows
from tandem.services.actor.servicer import SERVICE, ActorServicer
from tandem.services.actor.worker import ActorWorker
from tandem.serving.process import load_tokenizer, run_service
from tandem.serving.role import Built, Role
from tandem.serving.rollout_front import RolloutFront
from tandem.serving.rollout_servicer import SERVICE as ROLLOUT_SERVICE
from tandem.serving.rollout_servicer import GenerationLimits, RolloutServicer
from tandem.serving.startup import StartupClock


class ActorRole(Role):
    name = "actor"
    service_names = (SERVICE, ROLLOUT_SERVICE)

    def layout(self, cfg):
        return cfg.services.actor.world_size, ParallelConfig.of(cfg.actor_rollout_ref.actor.megatron)

    def check_layout(self, cfg) -> None:
        self.validate_layout(cfg, model_shape(cfg.actor_rollout_ref.model, len(load_tokenizer(cfg))))

    def build(self, cfg) -> Built:
        clock = StartupClock()
        with clock.phase("tokenizer"):
            tokenizer = load_tokenizer(cfg)
        worker = ActorWorker(cfg, len(tokenizer), clock)
        targets = {"actor": worker}
        rollout = cfg.actor_rollout_ref.rollout
        if rollout.mode == "colocated":
            with clock.phase("colocated rollout"):
                targets["rollout"] = hybrid.colocated_rollout_worker(
                    worker, tokenizer, rollout.max_batch_size, rollout.free_cache_engine,
                    rollout.tensor_model_parallel_size, tools=multi_turn_from_config(rollout, tokenizer))
        # Release drops its offload state
        return Built(targets, {"tokenizer": tokenizer}, closers=[worker.release], startup=clock)

    def servicers(self, cfg, built, group, thread):
        worker, tokenizer = built.targets["actor"], built.extras["tokenizer"]
        front = ActorFront(group, worker)
        kept = KeptRows(front, thread) if "rollout" in built.targets else None
        out = {SERVICE: ActorServicer(front, thread, kept)}
        if kept is not None:  # one thread for both: a generation never overlaps an update
            limits = GenerationLimits(worker.shape.max_position_embeddings, cfg.actor_rollout_ref.rollout.max_batch_size)
            out[ROLLOUT_SERVICE] = RolloutServicer(RolloutFront(group, worker.vocab_size, tokenizer.pad_token_id),
                                                   thread, limits=limits, kept=kept)
        return out


def main(argv=None) -> None:
    run_service(ActorRole(), argv)


if __name__ == "__main__":
    main()
