"""The rollout's EnvironmentCaller over gRPC (tandem/tools/calls.py: the seam): episodes of the
EnvironmentService each interaction's route names (verl's interactions, tandem/tools/interaction_config.py).

    env = GrpcEnvironmentCaller(load_interaction_config(path).routes, timeout_s=30)
    first = await env.start("guess_number", "run1-row0", {"name": "guess_number", "secret": 42})
    step = await env.step("guess_number", "run1-row0", "50")   # Outcome("Lower.", 0.0, False)
    await env.close("guess_number", "run1-row0")                # None, or why it failed

Nothing raises for a failed call (only cancellation passes): an interaction no route names, a task
that is not JSON, a deadline passed and a status other than OK each become an Outcome with `error`
set (the episode is over) and an `error: ...` observation naming the interaction. UNAVAILABLE and
RESOURCE_EXHAUSTED are retried within the deadline as tool calls are (tandem/tools/rpc_calls.py);
each call's deadline is its route's timeout_s, else the caller's. Deliberately not here: when a row
steps (the engine's), what the reward makes of the steps' rewards (the reward function's).
"""
from __future__ import annotations

import asyncio
import json
import uuid
from typing import Mapping

from tandem.logging import get_logger
from tandem.tools.calls import Outcome
from tandem.tools.rpc_calls import DETAILS_CHARS, Channels, check_settings, send
from tandem.tools.tool_config import ToolRoute
from tandem.v1 import tools_pb2, tools_pb2_grpc

_log = get_logger("tandem.tools")


class GrpcEnvironmentCaller:
    """routes: interaction name -> ToolRoute of its EnvironmentService. timeout_s, max_retries,
    retry_backoff_s, max_concurrency: as GrpcToolCaller's."""

    def __init__(self, routes: Mapping[str, ToolRoute], *, timeout_s: float = 30.0, max_retries: int = 3,
                 retry_backoff_s: float = 0.1, max_concurrency: int = 256, max_message_mb: int = 16):
        check_settings("GrpcEnvironmentCaller", timeout_s, max_retries, retry_backoff_s, max_concurrency)
        self.routes = dict(routes)
        self.timeout_s, self.max_retries, self.retry_backoff_s = timeout_s, max_retries, retry_backoff_s
        self._channels = Channels(tools_pb2_grpc.EnvironmentServiceStub, max_concurrency, max_message_mb)

    async def start(self, name: str, instance_id: str, task: dict) -> Outcome:
        try:
            task_json = json.dumps(task, allow_nan=False)
        except (TypeError, ValueError) as e:
            return Outcome.failed(f"interaction {name!r}: interaction_kwargs are not JSON: {e}")
        reply, failure = await self._call(name, "StartEpisode", tools_pb2.StartEpisodeRequest(
            instance_id=instance_id, task_json=task_json))
        return Outcome.failed(failure) if failure else Outcome(reply.observation)

    async def step(self, name: str, instance_id: str, action: str) -> Outcome:
        reply, failure = await self._call(name, "Step", tools_pb2.StepRequest(instance_id=instance_id, action=action))
        return Outcome.failed(failure) if failure else Outcome(reply.observation, reply.reward, reply.done)

    async def close(self, name: str, instance_id: str) -> str | None:
        _, failure = await self._call(name, "CloseEpisode", tools_pb2.CloseEpisodeRequest(instance_id=instance_id))
        return failure

    async def _call(self, name: str, method: str, request) -> tuple[object | None, str | None]:
        """(reply, None) or (None, why: naming the interaction and the call)."""
        route = self.routes.get(name)
        if route is None:
            return None, (f"unknown interaction {name!r} (extra_info.interaction_kwargs.name); the interactions "
                          f"are: {', '.join(sorted(self.routes))}")
        request_id = uuid.uuid4().hex[:16]
        try:
            stub, slots = self._channels.get(route)
            async with slots:  # the deadline starts when the call is sent, not while it queues
                reply, failure = await send(getattr(stub, method), request, route.timeout_s or self.timeout_s,
                                            max_retries=self.max_retries, retry_backoff_s=self.retry_backoff_s,
                                            request_id=request_id)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug or a bad TLS file must not stop the rollout
            reply, failure = None, f"could not be called: {type(e).__name__}: {str(e)[:DETAILS_CHARS]}"
        if failure is not None:
            _log.info("environment.call_failed", interaction=name, call=method, request_id=request_id, failure=failure)
            return None, f"interaction {name!r} {method} {failure}"
        return reply, None

    async def close_channels(self) -> None:
        await self._channels.close()
