"""Typed configuration for a run: one dataclass per section, verl's key names.

Loaded with OmegaConf (YAML file + dotted overrides). Unknown keys are errors that name the nearest
known keys; values are checked in validate() with the dotted key in every message. Services read the
same resolved file and take their own section.

- schema.py: the dataclasses (keys, defaults, what each means);
- load.py: load_config, to_yaml;
- cli_args.py, overrides.py: `tandem run`'s arguments (--config-path / --config-name / --dry-run) and
  overrides in Hydra's grammar;
- verl_keys.py, verl_compat.py, verl_defaults.yaml: verl's keys Tandem does not have under the same
  name (mapped or refused, with why), and classifying every key a user sets (unknown-key hints);
- verl_base.py: verl's defaults as a run's start (verl's config name), Tandem's that differ, and why;
- transformer_overrides.py: which megatron.override_transformer_config fields reach megatron-core;
- start_notices.py: what a run chooses by the machine it runs on (megatron.dtype auto), said at start;
- errors.py: ConfigError and the check helper;
- checks/: validate() and the value checks, one module per topic;
- model_file.py: what is read from the model's config.json (heads, experts, MoE checks,
  router_aux_loss_coeff).

The package imports nothing from tandem but tandem.algos (the estimator, loss and aggregation
registries it validates against), the model registry, and (inside checks/files.py) tandem.tokenizer.
"""
from tandem.config.checks import validate
from tandem.config.errors import ConfigError
from tandem.config.load import load_config, load_config_with_notices, to_yaml
from tandem.config.model_file import LOAD_BALANCING_TYPES, OVERRIDE_KEYS, router_aux_loss_coeff
from tandem.config.schema import (
    WEIGHT_TRANSPORTS,
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
    WeightSyncConfig,
)

__all__ = [
    "WEIGHT_TRANSPORTS",
    "WeightSyncConfig",
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
    "load_config_with_notices",
    "router_aux_loss_coeff",
    "to_yaml",
    "validate",
]
