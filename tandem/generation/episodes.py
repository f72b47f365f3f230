"""The environment episodes of one generate() call (verl's interactions): a row whose data names an
interaction plays one episode of it; each assistant turn it ends (a stop token, not a tool call) is
that episode's next Step, and the answer comes back as the next user turn.

`Episodes` starts every row's episode at once when the generation starts (StartEpisode with the
row's interaction_kwargs; the rows decode meanwhile), sends a row's Steps on the engine's tool loop
(multi_turn.ToolLoop) and keeps each row's `EpisodeRecord`: the Steps' rewards (verl's
`turn_scores`), whether it is over, and the error that ended it. `close` runs CloseEpisode for
every started episode when the generation ends, whatever ended it. Each call is bounded by
`Interactions.timeout_s` on top of the caller's own deadline; a failure or a timeout ends the episode
with its error recorded and shown to the model, never an exception or an empty observation.

Not here: when a row steps and how its observation is fed (multi_turn.ToolTurns), the services
(tandem/tools/grpc_episodes.py).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from dataclasses import asdict, dataclass, field
from typing import Protocol

from tandem.logging import get_logger
from tandem.tools.calls import EnvironmentCaller, Outcome

_log = get_logger("tandem.generation")


class TurnFormat(Protocol):
    """How an environment's side of the conversation is read and written, in token ids."""

    def turn_text(self, turn: list[int]) -> str:
        """The model's turn (its tokens, the stop token included) as the text a Step sends."""
        ...

    def user_turn(self, text: str) -> list[int]:
        """The tokens appended after a turn the model ended: `text` as the next user turn, and the
        opening of the model's next turn."""
        ...


@dataclass
class Interactions:
    """Environment settings of a MultiTurn (verl's multi_turn.interaction_config_path)."""
    caller: EnvironmentCaller
    timeout_s: float = 60.0  # bounds each Start/Step/Close beyond the caller's own deadline (a hung caller)

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"interaction timeout_s must be > 0, got {self.timeout_s}")


@dataclass
class EpisodeRecord:
    """One row's episode, as the reward stage sees it (the rollout's `episode` column)."""
    name: str
    instance_id: str
    turn_scores: list[float] = field(default_factory=list)  # each Step's reward, in order
    done: bool = False  # over: the environment said so, or a call failed
    error: str | None = None  # the failure that ended it

    def as_dict(self) -> dict:
        return asdict(self)


class Episodes:
    """tasks: each row's interaction_kwargs (None: the row plays none). calling: this rank calls the
    services (at TP > 1 only the group's first rank does; the others record the broadcast outcomes)."""

    def __init__(self, it: Interactions, loop, tasks: list[dict | None], calling: bool = True):
        self.it, self.loop, self.calling = it, loop, calling
        run = uuid.uuid4().hex[:12]
        self.records = [None if t is None else EpisodeRecord(str(t.get("name", "")), f"{run}-{row}")
                        for row, t in enumerate(tasks)]
        self._starts: dict[int, concurrent.futures.Future] = {}
        if calling:
            for row, task in enumerate(tasks):
                if task is not None:
                    rec = self.records[row]
                    self._starts[row] = loop.submit(self._guard(
                        it.caller.start(rec.name, rec.instance_id, task), rec.name, "StartEpisode"))

    def open(self, row: int) -> bool:
        rec = self.records[row]
        return rec is not None and not rec.done

    def step(self, row: int, action: str) -> concurrent.futures.Future | None:
        """The row's next Step, once its episode has started; its result is an Outcome (None on a rank
        that does not call: the outcome comes from the calling rank)."""
        return self.loop.submit(self._step(row, action)) if self.calling else None

    async def _step(self, row: int, action: str) -> Outcome:
        rec = self.records[row]
        started = await asyncio.wrap_future(self._starts[row])
        if started.error is not None:
            return started
        return await self._guard(self.it.caller.step(rec.name, rec.instance_id, action), rec.name, "Step")

    def record(self, row: int, outcome: Outcome) -> None:
        rec = self.records[row]
        if outcome.error is None:
            rec.turn_scores.append(float(outcome.reward))
        rec.done, rec.error = rec.done or outcome.done, rec.error or outcome.error

    def close(self) -> None:
        """CloseEpisode for every started episode (waits for starts still in flight); blocks until each
        is closed, failed or timed out. A start that failed is recorded on its row."""
        if self._starts:
            self.loop.submit(self._close_all()).result()
        self._starts = {}

    async def _close_all(self) -> None:
        await asyncio.gather(*(self._close(row, f) for row, f in self._starts.items()))

    async def _close(self, row: int, start: concurrent.futures.Future) -> None:
        rec = self.records[row]
        started = await asyncio.wrap_future(start)
        if started.error is not None:
            rec.done, rec.error = True, rec.error or started.error
        # closed even after a failed start: a start that timed out may have begun on the server
        why = await self._guard(self._close_call(rec), rec.name, "CloseEpisode")
        if why.error is not None and started.error is None:
            _log.warning("environment.close_failed", interaction=rec.name, instance_id=rec.instance_id,
                         error=why.error)

    async def _close_call(self, rec: EpisodeRecord) -> Outcome:
        why = await self.it.caller.close(rec.name, rec.instance_id)
        return Outcome("") if why is None else Outcome.failed(why)

    async def _guard(self, call, name: str, what: str) -> Outcome:
        try:
            return await asyncio.wait_for(call, self.it.timeout_s)
        except asyncio.TimeoutError:
            return Outcome.failed(f"interaction {name!r} {what} timed out after {self.it.timeout_s:g} s")
        except Exception as e:  # noqa: BLE001 - a caller breaking its contract must not end the rollout
            return Outcome.failed(f"interaction {name!r} {what}: {type(e).__name__}: {e}")
