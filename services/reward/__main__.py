"""Reward service: rules by data_source, or verl's custom compute_score, and/or a reward model
(a Hugging Face sequence-classification checkpoint on megatron-core). `python -m tandem.services.reward`.

Long-lived (no --config): waits for LifecycleService.Configure; with --config it takes that
run at start. Rules and functions only: rank 0 alone, no torch.distributed. With
reward_model.enable the run is served by a rank group like the critic's
(services.reward.world_size ranks; rank 0 serves).
"""
from __future__ import annotations

from tandem.parallel.layout import ParallelConfig
from tandem.services.reward.scorer import Scorer, text_scorer
from tandem.services.reward.servicer import SERVICE, RewardServicer
from tandem.serving.process import run_service
from tandem.serving.role import Built, Role


class RewardRole(Role):
    name = "reward"
    service_names = (SERVICE,)
    ranks_at_start = False  # rules need none; a reward model run starts its ranks
    imports_code = True  # custom_reward_function.path

    def ranked(self, cfg) -> bool:
        return cfg.reward_model.enable

    def layout(self, cfg):
        return cfg.services.reward.world_size, ParallelConfig.of(cfg.reward_model.megatron)

    def check_layout(self, cfg) -> None:
        from tandem.services.reward.model import reward_model_shape

        self.validate_layout(cfg, reward_model_shape(cfg))

        world, parallel = self.layout(cfg)
        shape = reward_model_shape(cfg)
        parallel.validate(world, shape.num_attention_heads, shape.num_key_value_heads,
                          shape.moe.num_experts if shape.moe else 0)

    def seed(self, cfg) -> int:
        return cfg.reward_model.megatron.seed

    def build(self, cfg) -> Built:
        if not cfg.reward_model.enable:
            return Built({})
        from tandem.services.reward.model import RewardModelWorker

        return Built({"reward_model": RewardModelWorker(cfg)})

    def servicers(self, cfg, built, group, thread):
        rm = cfg.reward_model
        if not rm.enable:
            scorer = Scorer(text_scorer(cfg))
            built.closers.append(scorer.close)
            return {SERVICE: RewardServicer(scorer, thread)}
        from tandem.services.reward.model import RewardModelFront

        worker = built.targets["reward_model"]
        text = text_scorer(cfg) if rm.rule_coef != 0 else None  # rank 0 only: its process pool lives here
        scorer = Scorer(text, RewardModelFront(group, worker, rm.micro_batch_size_per_gpu), rm.rule_coef)
        built.closers.append(scorer.close)
        return {SERVICE: RewardServicer(scorer, thread, worker.vocab_size)}


def main(argv=None) -> None:
    run_service(RewardRole(), argv)


if __name__ == "__main__":
    main()
