"""Checks of reward_model.* (the model-based reward, calling the reward service) and
custom_reward_function.* (verl's compute_score file).

A reward model's config.json is read through the model-family registry: an architecture that is
not a sequence-classification one Tandem can load is an error naming reward_model.model.path.
"""
from __future__ import annotations

import math
import os

from tandem.config.errors import ConfigError, check
from tandem.config.schema import TandemConfig
from tandem.config.transformer_overrides import check_transformer_overrides
from tandem.models import registry

ON_FAILURE = ("fail", "drop")


def check_reward_calls(cfg: TandemConfig) -> None:
    """reward_model.{timeout_s, max_retries, retry_backoff_s, on_failure, rule_coef}."""
    r = cfg.reward_model
    check(r.timeout_s > 0, "reward_model.timeout_s", "must be > 0")
    check(r.max_retries >= 0, "reward_model.max_retries", "must be >= 0")
    check(r.retry_backoff_s >= 0, "reward_model.retry_backoff_s", "must be >= 0")
    check(r.on_failure in ON_FAILURE, "reward_model.on_failure", f"{r.on_failure!r}; known: {list(ON_FAILURE)}")
    check(math.isfinite(r.rule_coef), "reward_model.rule_coef", "must be a finite number")


def check_reward_model(cfg: TandemConfig) -> None:
    """With reward_model.enable: a sequence-classification checkpoint and a micro-batch size."""
    r = cfg.reward_model
    if not r.enable:
        return
    check_transformer_overrides("reward_model.megatron", r.megatron)
    check(r.micro_batch_size_per_gpu >= 1, "reward_model.micro_batch_size_per_gpu", "must be >= 1")
    check(cfg.services.reward.endpoint is None, "services.reward.endpoint",
          "reward_model.enable hosts the reward model in Tandem's own reward service; leave the endpoint unset")
    path = r.model.path
    check(path is not None, "reward_model.model.path", "must be set when reward_model.enable=true")
    check(os.path.isfile(os.path.join(path, "config.json")), "reward_model.model.path",
          f"{path!r} is not a Hugging Face model directory (no config.json)")
    try:
        hf = registry.read_hf_config(path)
        family = registry.family(registry.architecture_of(hf))
        registry.shape_from_hf_config(hf)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"reward_model.model.path: {e}") from None
    check(family.head == "scalar", "reward_model.model.path",
          f"{family.architecture} is not a sequence-classification model (known: "
          f"{[a for a in registry.architectures() if registry.family(a).head == 'scalar']})")


def check_custom_reward_function(cfg: TandemConfig) -> None:
    """custom_reward_function.{path, name, timeout_s, num_workers}."""
    c = cfg.custom_reward_function
    if c.path is None:
        return
    check(os.path.isfile(c.path) and c.path.endswith(".py"), "custom_reward_function.path",
          f"{c.path!r} is not a Python file")
    check(c.name.isidentifier(), "custom_reward_function.name", f"{c.name!r} is not a Python name")
    check(c.timeout_s > 0, "custom_reward_function.timeout_s", "must be > 0")
    check(c.num_workers >= 1, "custom_reward_function.num_workers", "must be >= 1")
    check(cfg.services.reward.endpoint is None, "services.reward.endpoint",
          "custom_reward_function runs in Tandem's own reward service; leave the endpoint unset")
