"""One tool call as the rollout sees it, and what answers it: the seam between multi-turn generation
and the tool services (tandem/tools/grpc_caller.py), so the engine never waits on the network itself."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict  # the JSON object the model wrote


@dataclass(frozen=True)
class ToolResult:
    text: str  # the observation shown to the model; an error's message when ok is False
    ok: bool


class ToolCaller(Protocol):
    async def call(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One result per call, in order; failures are results with ok=False, never exceptions."""
        ...
