"""Critic service: value model (GPTModel trunk + scalar head). `python -m tandem.services.critic`.

Long-lived (no --config): waits for LifecycleService.Configure; with --config it takes that
run at start. With services.critic.world_size > 1 this process is rank 0 (the front door)
and starts the other ranks.
"""
from __future__ import annotations

from tandem.models.shape_from_config import model_shape
from tandem.parallel.layout import ParallelConfig
from tandem.services.critic.front import CriticFront
from tandem.services.critic.servicer import SERVICE, CriticServicer
from tandem.services.critic.worker import CriticWorker
from tandem.serving.process import load_tokenizer, run_service
from tandem.serving.role import Built, Role


class CriticRole(Role):
    name = "critic"
    service_names = (SERVICE,)

    def layout(self, cfg):
        return cfg.services.critic.world_size, ParallelConfig.of(cfg.critic.megatron)

    def check_layout(self, cfg) -> None:
        self.validate_layout(cfg, model_shape(cfg.actor_rollout_ref.model, len(load_tokenizer(cfg))))

    def seed(self, cfg) -> int:
        return cfg.critic.megatron.seed

    def build(self, cfg) -> Built:
        # starting from the policy, every trunk weight is loaded before use: none is drawn at random
        worker = CriticWorker(cfg, len(load_tokenizer(cfg)), weights_follow=cfg.critic.init_from_policy)
        return Built({"critic": worker}, closers=[worker.memory.drop])  # Release drops its offload state

    def servicers(self, cfg, built, group, thread):
        return {SERVICE: CriticServicer(CriticFront(group, built.targets["critic"]), thread)}


def main(argv=None) -> None:
    run_service(CriticRole(), argv)


if __name__ == "__main__":
    main()
