"""One tool call as the rollout sees it, and what answers it; an environment's episode likewise: the
seam between multi-turn generation and the tool and environment services (tandem/tools/grpc_caller.py,
grpc_episodes.py), so the engine never waits on the network itself."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, Sequence


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict  # the JSON object the model wrote
    # the row's kwargs for this tool, verl's extra_info.tools_kwargs[name] ({"create_kwargs": ...}); None: none
    kwargs: dict | None = None


def with_row_kwargs(calls: Sequence[ToolCall], tools_kwargs) -> list[ToolCall]:
    """The calls of one row, each carrying that row's tools_kwargs entry for its tool. A tools_kwargs
    that is not a mapping goes on as it is, so the caller reports it as the call's error."""
    if tools_kwargs is None:
        return list(calls)
    if not isinstance(tools_kwargs, dict):
        return [replace(c, kwargs=tools_kwargs) for c in calls]
    return [replace(c, kwargs=tools_kwargs.get(c.name)) for c in calls]


@dataclass(frozen=True)
class ToolResult:
    text: str  # the observation shown to the model; an error's message when ok is False
    ok: bool


class ToolCaller(Protocol):
    async def call(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One result per call, in order; failures are results with ok=False, never exceptions."""
        ...


@dataclass(frozen=True)
class Outcome:
    """What a StartEpisode or a Step gave."""
    observation: str  # what the model is shown next; with error set, the error's message
    reward: float = 0.0  # the step's reward (0 for a start or a failure)
    done: bool = False  # the episode is over
    error: str | None = None  # the call failed: the episode is over and this says why

    @classmethod
    def failed(cls, why: str) -> Outcome:
        return cls(f"error: {why}", 0.0, True, why)


class EnvironmentCaller(Protocol):
    async def start(self, name: str, instance_id: str, task: dict) -> Outcome:
        """Begin an episode of interaction `name` from a row's interaction_kwargs; never raises."""
        ...

    async def step(self, name: str, instance_id: str, action: str) -> Outcome:
        """The model's turn as text -> the observation, reward and done; never raises."""
        ...

    async def close(self, name: str, instance_id: str) -> str | None:
        """End the episode: None, or why closing failed; never raises."""
        ...
