"""Continuous-batching scheduler: plans on the CPU, never touches tensors.

The engine has a fixed number of cache slots. Each prompt's n samples are admitted
together into n free slots (one prefill per prompt, its KV copied into the n slots);
then the slots decode in windows of up to `sync_every` steps, after which the runner
reports which slots are still alive and finished slots are refilled from the waiting
prompts. A multi-turn row that stopped on a tool call is paused: its slot (and KV cache)
stays held, out of the decode plans, until `resume` hands it back after the observation. The plan also picks the static shapes of the decode (how many leading slots
to run and how many cache positions to attend over), rounded up to buckets so a few
captured CUDA graphs cover every window.

Not here: preemption, priorities, chunked prefill, anything about tensors.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Admission:
    prompt: int  # index into the request's prompts
    slots: tuple[int, ...]  # n slots; slot j holds output row prompt * n + j


@dataclass(frozen=True)
class Plan:
    admit: tuple[Admission, ...]  # prefill these prompts first (may be empty)
    decode_steps: int  # decode steps to run after the prefill (0: none)
    batch: int  # decode slots 0 .. batch-1 (a bucket >= the highest busy slot + 1)
    kv_len: int  # attend over cache positions 0 .. kv_len-1 (a bucket, <= max_len)


@dataclass
class _Slot:
    row: int
    position: int  # cache position of the next token fed to the model
    steps_left: int  # decode steps until max_new_tokens is reached


def round_up(value: int, buckets: list[int]) -> int:
    """The smallest bucket >= value (buckets sorted ascending; value <= buckets[-1])."""
    return buckets[bisect.bisect_left(buckets, value)]


@dataclass
class Scheduler:
    prompt_lens: list[int]
    n: int  # samples per prompt
    max_new_tokens: int
    num_slots: int
    max_len: int  # cache positions per slot
    sync_every: int = 1  # decode steps between looks at the finished flags
    batch_buckets: list[int] = field(default_factory=list)  # default: [num_slots]
    kv_bucket: int = 0  # round kv_len up to a multiple of this (0: max_len)
    _waiting: list[int] = field(init=False)
    _busy: dict[int, _Slot] = field(init=False, default_factory=dict)
    _paused: dict[int, _Slot] = field(init=False, default_factory=dict)  # waiting on a tool call

    def __post_init__(self):
        if self.n > self.num_slots:
            raise ValueError(f"n={self.n} samples need n slots, have num_slots={self.num_slots}")
        if self.max_new_tokens < 1 or self.sync_every < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} and sync_every="
                             f"{self.sync_every} must be >= 1")
        longest = max(self.prompt_lens, default=0)
        if longest + self.max_new_tokens > self.max_len:
            raise ValueError(f"prompt length {longest} + max_new_tokens {self.max_new_tokens} "
                             f"> max_len {self.max_len}")
        self.batch_buckets = sorted({b for b in self.batch_buckets if b < self.num_slots}
                                    | {self.num_slots})
        self._waiting = list(range(len(self.prompt_lens)))
        self._waiting.reverse()  # pop() from the end = first prompt first

    @property
    def done(self) -> bool:
        return not self._waiting and not self._busy and not self._paused

    @property
    def stalled(self) -> bool:
        """Nothing can run until a paused row resumes: no row decodes and none can be admitted."""
        return (not self._busy and bool(self._paused)
                and not (self._waiting and self.num_slots - len(self._paused) >= self.n))

    def busy_rows(self) -> dict[int, int]:
        """slot -> row for the slots that hold an unfinished row."""
        return {s: b.row for s, b in self._busy.items()}

    def schedule(self) -> Plan | None:
        """The next thing to run, or None when every row has finished."""
        if self.done:
            return None
        admit = self._admit()
        steps = min(self.sync_every, max((b.steps_left for b in self._busy.values()), default=0))
        if steps == 0:
            return Plan(tuple(admit), 0, 0, 0)
        batch = round_up(max(self._busy) + 1, self.batch_buckets)
        need = max(b.position for b in self._busy.values()) + steps
        kv_len = self.max_len
        if self.kv_bucket:
            kv_len = min(self.max_len, -(-need // self.kv_bucket) * self.kv_bucket)
        return Plan(tuple(admit), steps, batch, kv_len)

    def _admit(self) -> list[Admission]:
        free = sorted(set(range(self.num_slots)) - set(self._busy) - set(self._paused))  # lowest first
        admit = []  # every prompt that fits (the runner chunks the prefill by tokens)
        while self._waiting and len(free) >= self.n:
            p = self._waiting.pop()
            slots, free = tuple(free[:self.n]), free[self.n:]
            admit.append(Admission(p, slots))
            for j, s in enumerate(slots):
                # the prefill samples response token 0; decode feeds it at position len(prompt)
                self._busy[s] = _Slot(p * self.n + j, self.prompt_lens[p], self.max_new_tokens - 1)
        return admit

    def update(self, plan: Plan, alive: list[bool], paused: frozenset[int] = frozenset()) -> list[int]:
        """After the runner executed `plan`: alive[s] says whether slot s's row is still
        generating; the slots in `paused` stopped on a tool call and keep their slot. Frees the
        finished slots; returns their rows."""
        finished = []
        for s in sorted(self._busy):
            b = self._busy[s]
            b.position += plan.decode_steps
            b.steps_left -= plan.decode_steps
            if s in paused:
                self._paused[s] = self._busy.pop(s)
            elif not alive[s] or b.steps_left <= 0:
                finished.append(b.row)
                del self._busy[s]
        return finished

    def resume(self, slot: int, next_index: int, alive: bool) -> list[int]:
        """A paused row got its observation: the token at response index `next_index` is the next one
        the decode feeds (its stop token, then the queued observation). It decodes on from there, or
        finishes (returns [row]) when it is not alive."""
        b = self._paused.pop(slot)
        b.position = self.prompt_lens[b.row // self.n] + next_index
        b.steps_left = self.max_new_tokens - 1 - next_index
        if not alive or b.steps_left <= 0:
            return [b.row]
        self._busy[slot] = b
        return []
