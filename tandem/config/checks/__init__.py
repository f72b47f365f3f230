"""validate(): every value check of a loaded config, one topic per module.

Each check takes the whole TandemConfig and raises ConfigError("<dotted key>: <why>") at the first
bad value; validate() runs them in CHECKS' order. Each can also be called on its own.
"""
from __future__ import annotations

from tandem.config.checks.actor import check_actor, check_tis
from tandem.config.checks.algorithm import check_algorithm, check_dapo
from tandem.config.checks.memory import check_memory
from tandem.config.checks.parallel import check_parallel
from tandem.config.checks.placement import check_placement
from tandem.config.checks.reward import check_custom_reward_function, check_reward_calls, check_reward_model
from tandem.config.checks.rollout import check_rollout, check_val_kwargs
from tandem.config.checks.services import check_services
from tandem.config.checks.trainer import check_data, check_loggers, check_trainer
from tandem.config.model_file import check_model
from tandem.config.schema import TandemConfig

# The order decides which error a config with several gets (it is the order of the checks before the
# split into topics); a check may rely on the ones before it (rollout.n >= 1, parallel degrees >= 1).
CHECKS = (check_algorithm, check_rollout, check_data, check_actor, check_parallel, check_trainer, check_dapo,
          check_val_kwargs, check_tis, check_loggers, check_model, check_services, check_reward_calls,
          check_reward_model, check_custom_reward_function, check_placement, check_memory)


def validate(cfg: TandemConfig) -> None:
    """Raise ConfigError naming the dotted key of the first bad value of `cfg`."""
    for topic_check in CHECKS:
        topic_check(cfg)
