"""Standalone rollout service: its own copy of the policy, refreshed through the weight plane.

`python -m tandem.services.rollout` (long-lived: waits for LifecycleService.Configure) or
`python -m tandem.services.rollout --config RUN.yaml`. Disaggregated mode: after every update the
controller sends SyncWeights (a version and the actor's endpoint) and the rollout pulls the
weights from the actor itself (tandem/weights/): stream, CUDA IPC or a NCCL broadcast. With
services.rollout.world_size > 1 the ranks are actor_rollout_ref.rollout.tensor_model_parallel_size
x data parallel: prompts are split over the DP groups, and each rank slices its TP shard from
the TP=1 weights it receives.
"""
from __future__ import annotations

from tandem.models.build import build_gpt_model
from tandem.models.shape_from_config import model_shape
from tandem.parallel import device
from tandem.parallel.layout import ParallelConfig
from tandem.rollout.tools import multi_turn_from_config
from tandem.rollout.worker import RolloutWorker
from tandem.rpc.security import EndpointSecurity
from tandem.serving.process import load_tokenizer, run_service
from tandem.serving.role import Built, Role
from tandem.serving.rollout_front import RolloutFront
from tandem.serving.rollout_servicer import SERVICE, GenerationLimits, RolloutServicer
from tandem.weights.receiver import WeightReceiver
from tandem.weights.staging import WeightStaging


class RolloutRole(Role):
    name = "rollout"
    service_names = (SERVICE,)

    def layout(self, cfg):
        return cfg.services.rollout.world_size, ParallelConfig(tp=cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
                                                               or 1)

    def check_layout(self, cfg) -> None:
        self.validate_layout(cfg, model_shape(cfg.actor_rollout_ref.model, len(load_tokenizer(cfg))))

    def build(self, cfg) -> Built:
        rollout = cfg.actor_rollout_ref.rollout
        tokenizer = load_tokenizer(cfg)
        shape = model_shape(cfg.actor_rollout_ref.model, len(tokenizer))
        dtype = device.parse_dtype(cfg.actor_rollout_ref.actor.megatron.dtype)  # the weights it receives
        model = build_gpt_model(shape, tp=rollout.tensor_model_parallel_size or 1, params_dtype=dtype).eval()
        model.requires_grad_(False)
        worker = RolloutWorker(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                               vocab_size=model.vocab_size, max_batch_size=rollout.max_batch_size, weights_version=-1,
                               tools=multi_turn_from_config(rollout, tokenizer))
        staging = WeightStaging(model, shape, worker)
        # leave: the run's weight group with the actor (collective transport) goes with the run
        return Built({"rollout": worker, "weights": staging}, {"pad_id": tokenizer.pad_token_id, "max_positions": shape.max_position_embeddings},
                     closers=[staging.leave])

    def servicers(self, cfg, built, group, thread):
        worker, staging = built.targets["rollout"], built.targets["weights"]
        front = RolloutFront(group, worker.vocab_size, built.extras["pad_id"])
        # the rollout calls the actor's weight-plane RPCs with the actor's TLS and token
        actor_security = EndpointSecurity.from_section(cfg.services.actor, "services.actor")
        receiver = WeightReceiver(group, staging, thread, cfg.actor_rollout_ref.rollout.weight_sync, self.host,
                                  actor_security)
        limits = GenerationLimits(built.extras["max_positions"], cfg.actor_rollout_ref.rollout.max_batch_size)
        return {SERVICE: RolloutServicer(front, thread, receiver, limits)}


def main(argv=None) -> None:
    run_service(RolloutRole(), argv)


if __name__ == "__main__":
    main()
