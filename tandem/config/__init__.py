"""Typed configuration for a run: one dataclass per section, verl's key names.

Loaded with OmegaConf (YAML file + dotted overrides). Unknown keys are errors that name the nearest
known keys; values are checked in validate() with the dotted key in every message. Services read the
same resolved file and take their own section.

- schema.py: the dataclasses (keys, defaults, what each means);
- load.py: load_config, to_yaml, unknown-key hints;
- errors.py: ConfigError and the check helper;
- checks/: validate() and the value checks, one module per topic;
- model_file.py: what is read from the model's config.json (heads, experts, MoE checks,
  router_aux_loss_coeff).

The package imports nothing from tandem but tandem.algos (the estimator, loss and aggregation
registries it validates against).
"""
from tandem.config.checks import validate
from tandem.config.errors import ConfigError
from tandem.config.load import load_config, to_yaml
from tandem.config.model_file import LOAD_BALANCING_TYPES, OVERRIDE_KEYS, router_aux_loss_coeff
from tandem.config.schema import (
    ActorConfig,
    ActorRolloutRefConfig,
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
    FilterGroupsConfig,
    KLCtrlConfig,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
    OverlongBufferConfig,
    PolicyLossConfig,
    RefConfig,
    RefMegatronConfig,
    RewardModelConfig,
    RolloutConfig,
    ServiceEndpoint,
    ServicesConfig,
    SftConfig,
    TandemConfig,
    TrainerConfig,
    ValKwargsConfig,
)

__all__ = [
    "LOAD_BALANCING_TYPES",
    "OVERRIDE_KEYS",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "FilterGroupsConfig",
    "KLCtrlConfig",
    "MegatronConfig",
    "ModelConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "PolicyLossConfig",
    "RefConfig",
    "RefMegatronConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "ServiceEndpoint",
    "ServicesConfig",
    "SftConfig",
    "TandemConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "load_config",
    "router_aux_loss_coeff",
    "to_yaml",
    "validate",
]
