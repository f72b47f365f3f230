"""Checks of generation: rollout mode, samples per prompt, sampling and validation sampling (val_kwargs).

Generation's parallel layout (rollout.tensor_model_parallel_size) is checked with the actor's in
parallel.py.
"""
from __future__ import annotations

from tandem.algos.advantages import ADV_ESTIMATORS, uses_group_ids
from tandem.config.errors import check
from tandem.config.schema import TandemConfig

# actor_rollout_ref.rollout.mode: colocated (the actor process serves RolloutService) or standalone.
ROLLOUT_MODES = ("colocated", "standalone")


def check_rollout(cfg: TandemConfig) -> None:
    """actor_rollout_ref.rollout.*: mode, n (at least 2 for a group-baseline estimator), sampling."""
    r, estimator = cfg.actor_rollout_ref.rollout, cfg.algorithm.adv_estimator
    check(r.mode in ROLLOUT_MODES, "actor_rollout_ref.rollout.mode", f"{r.mode!r}; known: {list(ROLLOUT_MODES)}")
    check(r.n >= 1, "actor_rollout_ref.rollout.n", "must be >= 1")
    grouped = estimator in ADV_ESTIMATORS and uses_group_ids(estimator)
    check(not grouped or r.n >= 2, "actor_rollout_ref.rollout.n", f"{estimator} needs at least 2 samples per prompt")
    check(r.temperature > 0, "actor_rollout_ref.rollout.temperature", "must be > 0")
    check(0 < r.top_p <= 1, "actor_rollout_ref.rollout.top_p", "must be in (0, 1]")


# actor_rollout_ref.rollout.multi_turn.format: the tool-call formats tandem/rollout/tools.py builds
TOOL_FORMATS = ("auto", "hermes", "calculator")


def check_multi_turn(cfg: TandemConfig) -> None:
    """actor_rollout_ref.rollout.multi_turn.*: turns, format, tool deadlines."""
    mt, key = cfg.actor_rollout_ref.rollout.multi_turn, "actor_rollout_ref.rollout.multi_turn"
    check(mt.max_assistant_turns is None or mt.max_assistant_turns >= 1, f"{key}.max_assistant_turns",
          "must be >= 1 (or null)")
    check(mt.format in TOOL_FORMATS, f"{key}.format", f"{mt.format!r}; known: {list(TOOL_FORMATS)}")
    check(mt.max_parallel_calls >= 1, f"{key}.max_parallel_calls", "must be >= 1")
    check(mt.max_tool_response_length >= 1, f"{key}.max_tool_response_length", "must be >= 1")
    check(mt.tool_response_truncate_side in ("left", "right", "middle"), f"{key}.tool_response_truncate_side",
          f"{mt.tool_response_truncate_side!r}; known: left, right, middle")
    check(mt.tool_timeout_s > 0, f"{key}.tool_timeout_s", "must be > 0")
    check(mt.tool_retries >= 0, f"{key}.tool_retries", "must be >= 0")
    check(mt.max_user_turns is None or mt.max_user_turns >= 0, f"{key}.max_user_turns", "must be >= 0 (or null)")


def check_val_kwargs(cfg: TandemConfig) -> None:
    """actor_rollout_ref.rollout.val_kwargs: sampling for validation."""
    vk = cfg.actor_rollout_ref.rollout.val_kwargs
    check(vk.n >= 1, "actor_rollout_ref.rollout.val_kwargs.n", "must be >= 1")
    check(vk.do_sample or vk.n == 1, "actor_rollout_ref.rollout.val_kwargs.n",
          f"{vk.n} greedy samples would all be equal; set val_kwargs.do_sample=true or n=1")
    check(not vk.do_sample or vk.temperature > 0, "actor_rollout_ref.rollout.val_kwargs.temperature",
          "must be > 0 when val_kwargs.do_sample is true")
    check(0 < vk.top_p <= 1, "actor_rollout_ref.rollout.val_kwargs.top_p", "must be in (0, 1]")
