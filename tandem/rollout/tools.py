"""A rollout's multi-turn settings from the run's config: the one place a ToolCaller is built.

`tool_caller_from_config` picks what answers the calls: the built-in in-process calculator, or the
tool services that a verl tool-config YAML names (tandem/tools/grpc_caller.py, over gRPC).
`interactions_from_config` reads verl's interaction-config YAML: the EnvironmentServices that a row's
`extra_info.interaction_kwargs.name` picks (tandem/tools/grpc_episodes.py, over gRPC).
"""
from __future__ import annotations

from tandem.config.errors import ConfigError
from tandem.config.schema import MultiTurnConfig, RolloutConfig
from tandem.generation.episodes import Interactions
from tandem.generation.multi_turn import MultiTurn, ToolFormat
from tandem.tools.calls import ToolCaller

KEY = "actor_rollout_ref.rollout.multi_turn"


def multi_turn_from_config(rollout: RolloutConfig, tokenizer) -> MultiTurn | None:
    """The rollout's MultiTurn (None: single-turn generation)."""
    mt = rollout.multi_turn
    if not mt.enable:
        return None
    caller = tool_caller_from_config(mt)
    timeout_s, retries = mt.tool_timeout_s, mt.tool_retries
    if mt.tool_config_path is not None:
        # the gRPC caller bounds and retries each call itself, within each tool's own deadline (its
        # tool-config timeout_s): a shorter deadline here would cut a slow tool, and retries here would
        # send again what it retried.
        timeout_s, retries = hang_guard_s(caller.routes, mt.tool_timeout_s), 0
    fmt, interactions = tool_format(mt, tokenizer), interactions_from_config(mt)
    if interactions is not None and not hasattr(fmt, "user_turn"):
        raise ConfigError(f"{KEY}.interaction_config_path: the {type(fmt).__name__} (format={mt.format}) cannot write "
                          "an environment's turns as text; use format=hermes with a chat tokenizer")
    return MultiTurn(caller, fmt, max_assistant_turns=mt.max_assistant_turns, timeout_s=timeout_s, retries=retries,
                     max_tool_response_length=mt.max_tool_response_length, truncate_side=mt.tool_response_truncate_side,
                     interactions=interactions, max_user_turns=mt.max_user_turns)


def interactions_from_config(mt: MultiTurnConfig) -> Interactions | None:
    """The environments of verl's interaction-config YAML (None: no interaction_config_path). Each call's
    deadline is its interaction's timeout_s, else tool_timeout_s; tool_retries after UNAVAILABLE."""
    if mt.interaction_config_path is None:
        return None
    from tandem.tools.grpc_episodes import GrpcEnvironmentCaller
    from tandem.tools.interaction_config import load_interaction_config
    from tandem.tools.tool_config import ToolConfigError

    try:
        config = load_interaction_config(mt.interaction_config_path)
    except ToolConfigError as e:
        raise ConfigError(f"{KEY}.interaction_config_path: {e}") from None
    caller = GrpcEnvironmentCaller(config.routes, timeout_s=mt.tool_timeout_s, max_retries=mt.tool_retries)
    return Interactions(caller, timeout_s=hang_guard_s(config.routes, mt.tool_timeout_s))


def hang_guard_s(routes, default_s: float) -> float:
    """The outer bound on a gRPC caller's call, which bounds and retries each call itself within its
    route's deadline: twice the longest of those, so it only stops a caller that hangs."""
    return 2 * max([r.timeout_s or default_s for r in routes.values()] or [default_s])


def tool_caller_from_config(mt: MultiTurnConfig) -> ToolCaller:
    if mt.tool_config_path is None:
        from tandem.tasks.calculator_tool import CalculatorCaller

        return CalculatorCaller()
    from tandem.tools.grpc_caller import GrpcToolCaller
    from tandem.tools.tool_config import ToolConfigError, load_tool_config

    try:
        tools = load_tool_config(mt.tool_config_path)
    except ToolConfigError as e:
        raise ConfigError(f"{KEY}.tool_config_path: {e}") from None
    # its channels open in the engine's tool loop (ToolLoop) on first use; MultiTurn's deadline bounds each
    # attempt, the caller retries a service that is not up yet within it
    return GrpcToolCaller.from_tool_config(tools, timeout_s=mt.tool_timeout_s, max_retries=mt.tool_retries)


def tool_format(mt: MultiTurnConfig, tokenizer) -> ToolFormat:
    """format=auto: hermes when the tokenizer has a <tool_call> token, else the built-in calculator's."""
    from tandem.rollout.hermes_format import HermesFormat
    from tandem.tasks.calculator_tool import CalculatorFormat

    name = mt.format
    if name == "auto":
        name = "hermes" if "</tool_call>" in tokenizer.get_vocab() else "calculator"
    try:
        if name == "hermes":
            return HermesFormat(tokenizer, mt.max_parallel_calls)
        return CalculatorFormat(tokenizer)
    except ValueError as e:
        raise ConfigError(f"{KEY}.format={mt.format}: {e}") from None
