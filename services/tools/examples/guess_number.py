"""The example environment: guess a number from 1 to 100, told "higher" or "lower" after each guess.
Plain Python; server.py serves it as the EnvironmentService.

Task JSON: {"secret": 1..100 (default: drawn from the instance id, so reruns agree), "max_turns":
1..100 (default 7)}. A step's reward is 1.0 for the right guess (the episode ends), else 0.0; the
episode also ends after max_turns guesses. Errors are TandemErrors, so the server answers them with
their status: NotFound, AlreadyExists, FailedPrecondition, InvalidArgument, ResourceExhausted.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

from tandem.rpc.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted

MAX_OPEN_EPISODES = 10_000  # a caller that never closes must not grow the server without bound
_GUESS = re.compile(r"-?\d+")


@dataclass
class Episode:
    secret: int
    max_turns: int
    turns: int = 0
    done: bool = False


def _task_int(task: dict, key: str, default: int) -> int:
    value = task.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 100:
        raise InvalidArgument(f"task_json: '{key}' must be an integer from 1 to 100, got {value!r}")
    return value


class GuessNumber:
    def __init__(self):
        self.episodes: dict[str, Episode] = {}

    def start(self, instance_id: str, task_json: str) -> str:
        if not instance_id:
            raise InvalidArgument("instance_id: must not be empty")
        try:
            task = json.loads(task_json or "{}")
        except ValueError as e:
            raise InvalidArgument(f"task_json: not valid JSON: {e}") from None
        if not isinstance(task, dict):
            raise InvalidArgument(f"task_json: must be a JSON object, got {type(task).__name__}")
        if instance_id in self.episodes:
            raise AlreadyExists(f"instance_id {instance_id!r}: an episode is already open under this id")
        if len(self.episodes) >= MAX_OPEN_EPISODES:
            raise ResourceExhausted(f"{MAX_OPEN_EPISODES} episodes are open; close some first")
        secret = _task_int(task, "secret", random.Random(instance_id).randint(1, 100))
        self.episodes[instance_id] = Episode(secret, _task_int(task, "max_turns", 7))
        return "Guess my integer from 1 to 100. Answer with the number."

    def step(self, instance_id: str, action: str) -> tuple[str, float, bool]:
        ep = self._episode(instance_id)
        if ep.done:
            raise FailedPrecondition(f"instance_id {instance_id!r}: the episode is over; close it")
        ep.turns += 1
        guesses = _GUESS.findall(action)
        if not guesses:
            observation, reward = "No number found in your answer.", 0.0
        else:
            guess = int(guesses[-1])
            ep.done = guess == ep.secret
            observation = "Correct." if ep.done else ("Higher." if guess < ep.secret else "Lower.")
            reward = 1.0 if ep.done else 0.0
        if not ep.done and ep.turns >= ep.max_turns:
            ep.done, observation = True, observation + f" Out of turns: it was {ep.secret}."
        return observation, reward, ep.done

    def close(self, instance_id: str) -> None:
        self._episode(instance_id)
        del self.episodes[instance_id]

    def _episode(self, instance_id: str) -> Episode:
        ep = self.episodes.get(instance_id)
        if ep is None:
            raise NotFound(f"instance_id {instance_id!r}: no open episode (never started, or closed)")
        return ep
