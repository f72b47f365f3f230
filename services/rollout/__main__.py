"""Standalone rollout service: its own copy of the policy, refreshed by LoadWeights.

`python -m services.rollout` (long-lived: waits for LifecycleService.Configure) or
`python -m services.rollout --config RUN.yaml`. Disaggregated mode: the controller moves the
actor's weights here after every update (ExportWeights -> LoadWeights). With
services.rollout.world_size > 1 the prompts are split over that many ranks (DP).
"""
from __future__ import annotations

from tandem.models.build import build_gpt_model
from tandem.models.shape_from_config import model_shape
from tandem.parallel import device
from tandem.rollout.worker import RolloutWorker
from tandem.serving.process import load_tokenizer, run_service
from tandem.serving.role import Built, Role
from tandem.serving.rollout_front import RolloutFront
from tandem.serving.rollout_servicer import SERVICE, RolloutServicer


class RolloutRole(Role):
    name = "rollout"
    service_names = (SERVICE,)

    def build(self, cfg) -> Built:
        tokenizer = load_tokenizer(cfg)
        shape = model_shape(cfg.actor_rollout_ref.model, len(tokenizer))
        dtype = device.parse_dtype(cfg.actor_rollout_ref.actor.megatron.dtype)  # the weights it receives
        model = build_gpt_model(shape, params_dtype=dtype).eval()
        worker = RolloutWorker(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                               vocab_size=model.vocab_size, max_batch_size=cfg.actor_rollout_ref.rollout.max_batch_size)
        return Built({"rollout": worker}, {"pad_id": tokenizer.pad_token_id})

    def servicers(self, cfg, built, group, thread):
        front = RolloutFront(group, built.targets["rollout"].vocab_size, built.extras["pad_id"])
        return {SERVICE: RolloutServicer(front, thread)}


def main(argv=None) -> None:
    run_service(RolloutRole(), argv)


if __name__ == "__main__":
    main()
