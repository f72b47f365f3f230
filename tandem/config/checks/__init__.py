"""validate(): every value check of a loaded config, one topic per module.

Each check takes the whole TandemConfig and raises ConfigError("<dotted key>: <why>") at the first
bad value of its topic; problems_of() runs them all in CHECKS' order and returns every topic's error,
validate() raises them together. Each can also be called on its own.
"""
from __future__ import annotations

from tandem.config.checks.actor import check_actor, check_tis
from tandem.config.checks.algorithm import check_algorithm, check_dapo
from tandem.config.checks.async_training import check_async_training
from tandem.config.checks.files import check_model_files
from tandem.config.checks.lr_schedule import check_lr_schedules
from tandem.config.checks.memory import check_memory
from tandem.config.checks.micro_batches import check_micro_batches
from tandem.config.checks.parallel import check_parallel
from tandem.config.checks.placement import check_placement
from tandem.config.checks.profile import check_profile
from tandem.config.checks.reward import check_custom_reward_function, check_reward_calls, check_reward_model
from tandem.config.checks.rollout import check_multi_turn, check_rollout, check_val_kwargs
from tandem.config.checks.services import check_services
from tandem.config.checks.trainer import check_data, check_loggers, check_sft, check_trainer
from tandem.config.checks.weight_plane import check_devices, check_standalone_rollout
from tandem.config.errors import ConfigError, raise_all
from tandem.config.model_file import check_model
from tandem.config.schema import TandemConfig

# Data files are not here: only the controller reads them (tandem/config/paths.py checks them where it
# runs; a service on another machine loads the same config without them).
# The order decides which error a config with several gets (it is the order of the checks before the
# split into topics); a check may rely on the ones before it (rollout.n >= 1, parallel degrees >= 1).
CHECKS = (check_algorithm, check_rollout, check_multi_turn, check_data, check_actor, check_parallel, check_trainer,
          check_dapo, check_val_kwargs, check_tis, check_loggers, check_model, check_services, check_reward_calls,
          check_reward_model, check_custom_reward_function, check_placement, check_standalone_rollout, check_devices,
          check_model_files, check_sft, check_async_training, check_profile, check_memory,
          check_micro_batches, check_lr_schedules)


def problems_of(cfg: TandemConfig) -> list[str]:
    """Every topic's first bad value, "<dotted key>: <why>" each, in CHECKS' order."""
    found: list[str] = []
    for topic_check in CHECKS:
        try:
            topic_check(cfg)
        except ConfigError as e:
            # the layout checks read config.json too: one report of a bad file
            found += [p for p in e.problems if p not in found]
        except (ArithmeticError, TypeError, ValueError):
            if not found:  # a check tripping over a value an earlier check already refused
                raise
    return found


def validate(cfg: TandemConfig) -> None:
    """Raise ConfigError naming the dotted key of each bad value of `cfg` (one line per topic)."""
    raise_all(problems_of(cfg))
