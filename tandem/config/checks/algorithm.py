"""Checks of the algorithm section: the advantage estimator and DAPO (dynamic sampling, overlong shaping).

The estimators are the ones registered in tandem.algos.advantages: registering one makes its name
valid here. The KL settings (kl_penalty, kl_ctrl.type, actor kl_loss_type) are not checked at load
time: tandem.algos.kl refuses an unknown name when it is used.
"""
from __future__ import annotations

from tandem.algos.advantages import ADV_ESTIMATORS
from tandem.config.errors import check
from tandem.config.schema import TandemConfig

# algorithm.filter_groups.metric: the keys of controller/dapo.py's METRIC_COLUMNS (the library does not
# import the controller; tests/unit/test_config_checks.py keeps the two equal).
FILTER_GROUPS_METRICS = ("acc", "score", "seq_reward")


def check_algorithm(cfg: TandemConfig) -> None:
    """algorithm.adv_estimator names a registered estimator."""
    estimators = sorted(ADV_ESTIMATORS)
    check(cfg.algorithm.adv_estimator in estimators, "algorithm.adv_estimator",
          f"{cfg.algorithm.adv_estimator!r} is not available; known: {estimators}")


def check_dapo(cfg: TandemConfig) -> None:
    """DAPO: dynamic sampling (algorithm.filter_groups, data.gen_batch_size) and overlong reward shaping."""
    d, fg, ob = cfg.data, cfg.algorithm.filter_groups, cfg.reward_model.overlong_buffer
    check(fg.metric in FILTER_GROUPS_METRICS, "algorithm.filter_groups.metric",
          f"{fg.metric!r}; known: {sorted(FILTER_GROUPS_METRICS)}")
    check(not fg.enable or cfg.actor_rollout_ref.rollout.n >= 2, "algorithm.filter_groups.enable",
          "dynamic sampling needs actor_rollout_ref.rollout.n >= 2 (a group of one always has equal rewards)")
    check(d.gen_batch_size is None or d.gen_batch_size >= 1, "data.gen_batch_size", "must be >= 1")
    check(not ob.enable or 0 < ob.len <= d.max_response_length, "reward_model.overlong_buffer.len",
          f"{ob.len} must be in (0, data.max_response_length={d.max_response_length}]")
    check(ob.penalty_factor >= 0, "reward_model.overlong_buffer.penalty_factor", "must be >= 0")
