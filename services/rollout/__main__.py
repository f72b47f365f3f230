"""Standalone rollout service: its own copy of the policy, refreshed through the weight plane.

`python -m services.rollout --config RUN.yaml`. Disaggregated mode: after every update the
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
from tandem.rollout.worker import RolloutWorker
from tandem.rpc.security import EndpointSecurity
from tandem.serving.process import init_service, load_tokenizer, parse_args, serve_group
from tandem.serving.rank_group import RankGroup
from tandem.serving.rollout_front import RolloutFront
from tandem.serving.rollout_servicer import SERVICE, RolloutServicer
from tandem.weights.receiver import WeightReceiver
from tandem.weights.staging import WeightStaging


def main(argv=None) -> None:
    args = parse_args("rollout", argv)
    cfg = args.cfg
    rollout = cfg.actor_rollout_ref.rollout
    tp = rollout.tensor_model_parallel_size or 1
    tokenizer = load_tokenizer(cfg)
    shape = model_shape(cfg.actor_rollout_ref.model, len(tokenizer))
    init_service("rollout", args, cfg.services.rollout.torch_threads, cfg.actor_rollout_ref.actor.megatron.seed,
                 parallel=ParallelConfig(tp=tp), world_size=cfg.services.rollout.world_size, shape=shape,
                 gpu_memory_fraction=cfg.services.rollout.gpu_memory_fraction)
    dtype = device.parse_dtype(cfg.actor_rollout_ref.actor.megatron.dtype)  # the weights it receives
    model = build_gpt_model(shape, tp=tp, params_dtype=dtype).eval()
    model.requires_grad_(False)
    worker = RolloutWorker(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                           vocab_size=model.vocab_size, max_batch_size=rollout.max_batch_size, weights_version=-1)
    staging = WeightStaging(model, shape, worker)
    group = RankGroup({"rollout": worker, "weights": staging})
    front = RolloutFront(group, model.vocab_size, tokenizer.pad_token_id)

    def servicers(thread):
        # the rollout calls the actor's weight-plane RPCs with the actor's TLS and token
        actor_security = EndpointSecurity.from_section(cfg.services.actor, "services.actor")
        receiver = WeightReceiver(group, staging, thread, rollout.weight_sync, args.host, actor_security)
        return [(SERVICE, RolloutServicer(front, thread, receiver))]

    serve_group("rollout", args, group, servicers)


if __name__ == "__main__":
    main()
