"""Standalone rollout service: its own copy of the policy, refreshed by LoadWeights.

`python -m services.rollout --config RUN.yaml`. Disaggregated mode: the controller
moves the actor's weights here after every update (ExportWeights -> LoadWeights).
With services.rollout.world_size > 1 the prompts are split over that many ranks (DP).
"""
from __future__ import annotations

from tandem.models.build import build_gpt_model
from tandem.models.shape_from_config import model_shape
from tandem.parallel import device
from tandem.rollout.worker import RolloutWorker
from tandem.serving.process import init_service, load_tokenizer, parse_args, serve_group
from tandem.serving.rank_group import RankGroup
from tandem.serving.rollout_front import RolloutFront
from tandem.serving.rollout_servicer import SERVICE, GenerationLimits, RolloutServicer


def main(argv=None) -> None:
    args = parse_args("rollout", argv)
    cfg = args.cfg
    tokenizer = load_tokenizer(cfg)
    shape = model_shape(cfg.actor_rollout_ref.model, len(tokenizer))
    init_service("rollout", args, cfg.services.rollout.torch_threads, cfg.actor_rollout_ref.actor.megatron.seed,
                 world_size=cfg.services.rollout.world_size, shape=shape)
    dtype = device.parse_dtype(cfg.actor_rollout_ref.actor.megatron.dtype)  # the weights it receives
    model = build_gpt_model(shape, params_dtype=dtype).eval()
    worker = RolloutWorker(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                           vocab_size=model.vocab_size, max_batch_size=cfg.actor_rollout_ref.rollout.max_batch_size)
    group = RankGroup({"rollout": worker})
    front = RolloutFront(group, model.vocab_size, tokenizer.pad_token_id)
    limits = GenerationLimits(shape.max_position_embeddings, cfg.actor_rollout_ref.rollout.max_batch_size)
    serve_group("rollout", args, group, lambda thread: [(SERVICE, RolloutServicer(front, thread, limits=limits))])


if __name__ == "__main__":
    main()
