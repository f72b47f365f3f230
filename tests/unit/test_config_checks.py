"""The config package's checks: allowed values come from their owners, checks run on their own.

tests/unit/test_config.py pins the messages through load_config; here: the lists in the messages are
the registries' (a new estimator or mode needs no config change), each check is a plain function
over a TandemConfig, validate() runs all of them, and the package imports only tandem.algos.
"""
import dataclasses
import inspect
import json
import pathlib
import subprocess
import sys

import pytest

from tandem.algos import advantages, aggregate
from tandem.algos import losses as algo_losses
from tandem.config import ConfigError, MegatronConfig, TandemConfig, checks, load_config, validate
from tandem.config.checks import (
    actor,
    algorithm,
    files,
    memory,
    parallel,
    placement,
    reward,
    rollout,
    services,
    trainer,
)
from tandem.config.model_file import check_model, check_moe

A = "actor_rollout_ref"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def error_of(*overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, list(overrides))
    return str(e.value)


def test_estimators_are_the_registry():
    msg = error_of("algorithm.adv_estimator=nope")
    assert msg.endswith(f"known: {sorted(advantages.ADV_ESTIMATORS)}"), msg
    for name in advantages.ADV_ESTIMATORS:
        assert load_config(None, [f"algorithm.adv_estimator={name}"]).algorithm.adv_estimator == name


def test_a_registered_estimator_is_accepted_without_touching_config():
    @advantages.register_adv_estimator("test_group_baseline")
    def group_baseline(token_level_rewards, response_mask, index):
        return token_level_rewards, token_level_rewards

    try:
        load_config(None, ["algorithm.adv_estimator=test_group_baseline"])
        assert "'test_group_baseline'" in error_of("algorithm.adv_estimator=nope")
        # it takes group ids, so it needs groups (as grpo does)
        msg = error_of("algorithm.adv_estimator=test_group_baseline", f"{A}.rollout.n=1")
        assert msg == f"{A}.rollout.n: test_group_baseline needs at least 2 samples per prompt"
    finally:
        del advantages.ADV_ESTIMATORS["test_group_baseline"]


def test_group_estimators_are_the_ones_taking_group_ids():
    grouped = {name for name in advantages.ADV_ESTIMATORS if advantages.uses_group_ids(name)}
    assert grouped == {"grpo", "rloo", "reinforce_plus_plus_baseline"}
    for name in sorted(advantages.ADV_ESTIMATORS):
        overrides = [f"algorithm.adv_estimator={name}", f"{A}.rollout.n=1"]
        if name in grouped:
            assert error_of(*overrides).startswith(f"{A}.rollout.n: {name} needs at least 2"), name
        else:
            load_config(None, overrides)


def test_loss_modes_are_the_algos_registries():
    assert actor.LOSS_AGG_MODES is aggregate.LOSS_AGG_MODES  # imported, not a copy
    assert actor.POLICY_LOSS_MODES is algo_losses.POLICY_LOSS_MODES
    for mode in aggregate.LOSS_AGG_MODES:
        assert load_config(None, [f"{A}.actor.loss_agg_mode={mode}"]).actor_rollout_ref.actor.loss_agg_mode == mode
    for mode in algo_losses.POLICY_LOSS_MODES:
        load_config(None, [f"{A}.actor.policy_loss.loss_mode={mode}"])
    msg = error_of(f"{A}.actor.policy_loss.loss_mode=ppo")
    assert msg.endswith(f"known: {sorted(algo_losses.POLICY_LOSS_MODES)}"), msg


def test_lists_kept_in_config_equal_the_controllers():
    """The controller owns these; the library may not import it, so the copies are pinned here."""
    from tandem.controller.dapo import METRIC_COLUMNS
    from tandem.controller.tracking import KNOWN_LOGGERS

    assert trainer.LOGGERS == KNOWN_LOGGERS
    assert error_of("trainer.logger=[neptune]").endswith("known: " + ", ".join(KNOWN_LOGGERS))
    assert set(algorithm.FILTER_GROUPS_METRICS) == set(METRIC_COLUMNS)


def test_a_check_runs_on_its_own():
    cfg = TandemConfig()
    for check in checks.CHECKS:
        check(cfg)  # the defaults pass every check
    cfg.actor_rollout_ref.actor.loss_agg_mode = "sum"
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.actor\.loss_agg_mode: unknown mode 'sum'$"):
        actor.check_actor(cfg)
    rollout.check_rollout(cfg)  # other topics do not look at it
    cfg.critic.megatron.tensor_model_parallel_size, cfg.services.critic.world_size = 3, 3
    with pytest.raises(ConfigError, match=r"^critic\.megatron\.tensor_model_parallel_size: 3 must divide"):
        parallel.check_parallel(cfg)
    cfg.actor_rollout_ref.model.path = "/no/such/model"
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.model\.path: '/no/such/model' is not"):
        check_model(cfg)
    ep2 = dataclasses.replace(MegatronConfig(), expert_model_parallel_size=2)
    with pytest.raises(ConfigError, match=r"^critic\.megatron\.expert_model_parallel_size: 2 needs a mixture"):
        check_moe("critic.megatron", ep2, None)
    with pytest.raises(ConfigError, match="loss_agg_mode"):
        validate(cfg)  # the first failing check in CHECKS' order


def test_validate_runs_every_check():
    """A check_* function added to a topic module is in CHECKS (check_moe is per layout: check_parallel's;
    check_data_files runs where the controller runs: tandem/config/paths.py)."""
    import importlib
    import pkgutil

    modules = [importlib.import_module(f"tandem.config.checks.{m.name}") for m in pkgutil.iter_modules(checks.__path__)]
    assert {actor, algorithm, files, memory, parallel, placement, reward, rollout, services, trainer} <= set(modules)  # control
    defined = {fn for module in modules
               for name, fn in inspect.getmembers(module, inspect.isfunction)
               if name.startswith("check_") and fn.__module__ == module.__name__}
    assert defined | {check_model} == set(checks.CHECKS) | {files.check_data_files}
    assert len(checks.CHECKS) == len(set(checks.CHECKS))


def test_the_package_loads_only_algos_and_the_model_registry():
    """Config is read by the controller, which must stay light: the estimators' and losses'
    registries (tandem.algos) and the model-family registry (config.json -> shape), no megatron."""
    code = ("import json, sys\nimport tandem.config\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('tandem.', 'megatron')))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout.strip().splitlines()[-1])
    other = [m for m in loaded if not m.startswith(("tandem.config", "tandem.algos", "tandem.models"))]
    assert not other, other
    assert not [m for m in loaded if m.startswith(("tandem.models.build", "megatron"))], loaded
    assert "tandem.config.model_file" in loaded and "tandem.algos.advantages" in loaded  # control
