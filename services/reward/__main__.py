"""Reward service: rule verifiers chosen per row by data_source. `python -m services.reward`.

Long-lived (no --config): waits for LifecycleService.Configure (the run's
reward_model.default_rule); with --config it takes that run at start. No ranks, no model.
"""
from __future__ import annotations

from services.reward.servicer import SERVICE, RewardServicer
from services.reward.worker import RewardWorker
from tandem.serving.process import run_service
from tandem.serving.role import Built, Role


class RewardRole(Role):
    name = "reward"
    service_names = (SERVICE,)
    ranked = False

    def build(self, cfg) -> Built:
        return Built({"reward": RewardWorker(default_rule=cfg.reward_model.default_rule)})

    def servicers(self, cfg, built, group, thread):
        return {SERVICE: RewardServicer(built.targets["reward"], thread)}


def main(argv=None) -> None:
    run_service(RewardRole(), argv)


if __name__ == "__main__":
    main()
