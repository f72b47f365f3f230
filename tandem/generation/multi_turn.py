"""Multi-turn generation: a row that ends a turn with a tool call waits for the answer while the
other rows decode on, then continues on its own KV cache.

The runner stops a row on the format's `end_id` (the token closing a tool call) like on any stop
token. `ToolTurns.pause` picks the rows that stopped there with turns and budget left, parses the
turn's calls and issues them at once on `ToolLoop`'s event loop (a thread): every row's calls are
one `ToolCaller.call` of their own, so a slow tool holds only the rows that called it. Each call
has a deadline and retries; what still fails becomes an error observation (ok=False), never an
exception or an empty answer. A row's calls carry its `tools_kwargs` entry for each tool (verl's
extra_info.tools_kwargs; ToolCall.kwargs). `ToolTurns.resume` queues the answered rows' observation
tokens on their slots (turn_prefill.feed_observations) and hands the slots back to the scheduler: the
decode feeds them a token a step into the row's KV cache (the prefix is not recomputed) and samples
on after them. The engine waits on the tools only when no row can decode (Scheduler.stalled). At
TP > 1 (lockstep: every rank of the group runs this loop) only the group's first rank calls the
tools and broadcasts the answers that have come: a tool
answering two ranks differently (a timeout on one, a stateful tool) must not split the group's rows,
a side effect must happen once, and a slow tool holds only its rows there too.

Environments (`MultiTurn.interactions`, episodes.py): a row whose data names an interaction also
pauses when it ends a turn on a stop token (not a tool call); the turn's text is its episode's next
Step and the answer comes back the same way, as a user turn (`TurnFormat.user_turn`). A step that
ends the episode (done, or failed) is appended too and ends the row, as verl does.

Not here: the tool services (tandem/tools/), the wire format of a task's calls (ToolFormat
implementations: tandem/tasks/calculator_tool.py, tandem/rollout/hermes_format.py).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import dataclass
from typing import Protocol, Sequence

from tandem.generation.episodes import Episodes, Interactions
from tandem.generation.turn_prefill import end_row, feed_observations, stopped_at
from tandem.tools.calls import ToolCall, ToolCaller, ToolResult, with_row_kwargs


class ToolFormat(Protocol):
    """How a model writes tool calls and reads their answers, in token ids."""

    end_id: int  # the token that closes a tool call: the row stops there and waits

    def parse(self, turn: list[int]) -> list[ToolCall]:
        """The calls in one model turn (its tokens, up to and including end_id); [] if none parse."""
        ...

    def observation(self, results: Sequence[ToolResult]) -> list[int]:
        """The tokens appended after the call: the answers as the model will read them."""
        ...


@dataclass
class MultiTurn:
    """Multi-turn settings of one generate() call (verl's rollout.multi_turn.* keys)."""
    caller: ToolCaller
    format: ToolFormat
    max_assistant_turns: int | None = None  # model turns per row, the last cannot call a tool (None: no limit)
    timeout_s: float = 30.0  # per attempt of a row's calls
    retries: int = 1  # attempts after a timeout or an exception (an ok=False answer is final)
    max_tool_response_length: int = 256  # characters of each answer's text kept (verl's key)
    truncate_side: str = "middle"  # left | right | middle: which part of a long answer is kept
    interactions: Interactions | None = None  # environments a row's data may name (format: a TurnFormat too)
    max_user_turns: int | None = None  # observations per row, tool answers and environment turns (verl's key)

    def __post_init__(self):
        if self.max_assistant_turns is not None and self.max_assistant_turns < 1:
            raise ValueError(f"max_assistant_turns must be >= 1, got {self.max_assistant_turns}")
        if self.max_user_turns is not None and self.max_user_turns < 0:
            raise ValueError(f"max_user_turns must be >= 0, got {self.max_user_turns}")
        if self.interactions is not None and not hasattr(self.format, "user_turn"):
            raise ValueError(f"{type(self.format).__name__} cannot write an environment's turns (no user_turn)")
        if self.truncate_side not in ("left", "right", "middle"):
            raise ValueError(f"tool_response_truncate_side must be left, right or middle, got {self.truncate_side!r}")
        if not self.timeout_s > 0 or self.retries < 0:
            raise ValueError(f"tool timeout_s must be > 0 and retries >= 0, got {self.timeout_s}, {self.retries}")


class ToolLoop:
    """An asyncio loop on a daemon thread, for an engine's lifetime: the tool calls run there while
    the engine's thread decodes (a gRPC caller's channel stays on this one loop)."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tool-calls", daemon=True)
        self._thread.start()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


def truncate(text: str, limit: int, side: str) -> str:
    if len(text) <= limit:
        return text
    if side == "left":  # verl: keep the end
        return "..." + text[-limit:]
    if side == "right":
        return text[:limit] + "..."
    half = limit // 2
    return text[:half] + "..." + text[len(text) - (limit - half):]


async def answer(mt: MultiTurn, calls: list[ToolCall]) -> list[ToolResult]:
    """One result per call, whatever happens: parse failures, timeouts, exceptions and wrong result
    counts become error results."""
    if not calls:
        return [ToolResult("error: no tool call could be parsed from the turn", ok=False)]
    why = ""
    for _ in range(mt.retries + 1):
        try:
            results = await asyncio.wait_for(mt.caller.call(calls), mt.timeout_s)
        except asyncio.TimeoutError:
            why = f"timed out after {mt.timeout_s:g} s"
            continue
        except Exception as e:  # noqa: BLE001 - a caller breaking its contract must not end the rollout
            why = f"{type(e).__name__}: {e}"
            continue
        if len(results) != len(calls):
            why = f"the tool caller returned {len(results)} results for {len(calls)} calls"
            continue
        return [ToolResult(truncate(r.text, mt.max_tool_response_length, mt.truncate_side), r.ok)
                for r in results]
    tries = mt.retries + 1
    return [ToolResult(f"error: {c.name}: {why} ({tries} attempt{'s' * (tries > 1)})", ok=False)
            for c in calls]


class ToolTurns:
    """The tool rounds (and environment turns) of one generate() call: per-row turn counts and the
    calls in flight."""

    def __init__(self, mt: MultiTurn, loop: ToolLoop, rows: int, max_new_tokens: int, lockstep: bool = False,
                 tasks: list[dict | None] | None = None, tools_kwargs: list | None = None):
        self.mt, self.loop, self.r, self.lockstep = mt, loop, max_new_tokens, lockstep
        self.tools_kwargs = tools_kwargs or [None] * rows  # each row's verl tools_kwargs, sent with its calls
        self.calling = not lockstep or _tp_rank() == 0  # the rank that calls the tools
        self.turns = [1] * rows  # model turns started
        self.calls = [0] * rows  # tool calls parsed and issued
        self.errors = [0] * rows  # error observations: failed calls, turns whose call did not parse
        self.user_turns = [0] * rows  # observations appended (tool answers and environment turns)
        self.turn_start = [0] * rows  # response index where the row's current turn began
        # slot -> row, index, answer (None on a rank that does not call), whether it is an environment's
        self.pending: dict[int, tuple[int, int, concurrent.futures.Future | None, bool]] = {}
        self.episodes = None  # the rows' environment episodes (episodes.py), when any row names one
        if mt.interactions is not None and tasks is not None and any(t is not None for t in tasks):
            self.episodes = Episodes(mt.interactions, loop, tasks, self.calling)

    def _maybe_call(self, slot: int, row: int, index: int, token: int | None, runner, stopped: bool) -> bool:
        """Issue the row's calls (or its episode's Step) if it stopped on a tool call (or ended a turn
        in an open episode) with a turn and budget left."""
        limit = self.mt.max_assistant_turns or self.r  # a turn takes a token at least
        users = self.mt.max_user_turns if self.mt.max_user_turns is not None else self.r
        if not stopped or token is None or index >= self.r - 1 or self.turns[row] >= limit \
                or self.user_turns[row] >= users:
            return False
        turn = runner.out_tok[row, self.turn_start[row]:index + 1].tolist()
        if token == self.mt.format.end_id:
            calls = with_row_kwargs(self.mt.format.parse(turn), self.tools_kwargs[row])
            self.calls[row] += len(calls)
            future, env = (self.loop.submit(answer(self.mt, calls)) if self.calling else None), False
        elif self.episodes is not None and self.episodes.open(row):
            future, env = self.episodes.step(row, self.mt.format.turn_text(turn)), True
        else:
            return False
        self.pending[slot] = (row, index, future, env)  # future None: the calling rank's answer comes in resume
        return True

    def pause(self, runner, sched, alive: list[bool]) -> frozenset[int]:
        """After a decode window: the stopped rows that wait on a tool or an environment now."""
        stopped = [s for s in sched.busy_rows() if not alive[s]]
        return frozenset(s for s, (row, index, token) in zip(stopped, stopped_at(runner, stopped))
                         if self._maybe_call(s, row, index, token, runner, stopped=True))

    def resume(self, runner, sched, block: bool, poll_s: float = 0.5) -> None:
        """Continue every row whose answer has come (with block: wait up to poll_s for one first), its
        observation queued for the decode to feed (feed_observations). In lockstep (TP > 1: every rank of
        the group runs this loop) the calling rank's answered rows, with their answers, go to every rank,
        so all ranks resume the same rows at the same step and plan the same decode shapes, while the rows
        still waiting wait alone."""
        if not self.pending:
            return
        if block and self.calling:
            concurrent.futures.wait([p[2] for p in self.pending.values()], timeout=poll_s,
                                    return_when=concurrent.futures.FIRST_COMPLETED)
        answered = {s: p[2].result() for s, p in self.pending.items() if self.calling and p[2].done()}
        if self.lockstep:
            answered = _from_first_rank(answered)
        ready = []  # (slot, row, index, observation) of the rows that go on
        for slot, result in answered.items():
            row, index, _, env = self.pending.pop(slot)
            self.user_turns[row] += 1
            if env:
                self.episodes.record(row, result)
                obs = self.mt.format.user_turn(result.observation)
                if not self.episodes.open(row):  # the episode is over: its last observation ends the row
                    sched.resume(slot, end_row(runner, slot, index, obs), False)
                    continue
            else:
                self.errors[row] += sum(not r.ok for r in result)
                obs = self.mt.format.observation(result)
            ready.append((slot, row, index, obs))
        went_on = feed_observations(runner, [(slot, index, obs) for slot, _, index, obs in ready])
        for (slot, row, index, obs), (nxt, going) in zip(ready, went_on):
            self.turns[row] += going  # a model turn follows the observation unless it filled the budget
            self.turn_start[row] = nxt
            sched.resume(slot, index if going else nxt, going)  # the decode feeds the stop token first

    def cancel(self) -> None:
        for p in self.pending.values():
            if p[2] is not None:
                p[2].cancel()
        self.pending.clear()

    def close(self) -> None:
        """End every episode this generation started (CloseEpisode), however the generation ended."""
        if self.episodes is not None:
            self.episodes.close()


def _tp_rank() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_rank()


def _from_first_rank(answers: dict) -> dict:
    """The tensor-parallel group's first rank's answers, on every rank of the group."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    box = [answers]
    dist.broadcast_object_list(box, src=parallel_state.get_tensor_model_parallel_src_rank(),
                               group=parallel_state.get_tensor_model_parallel_group())
    return box[0]
