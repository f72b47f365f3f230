"""Deadlines measured from a service's own calls, so a hung service is noticed long before the
configured timeout.

`CallDeadlines` belongs to one service (every client that calls it shares it). Per RPC method it
keeps the seconds per unit of work of the last KEPT calls that succeeded (`work_of`: the elements
of the largest tensor a request carries, i.e. rows x tokens of its batch, times the samples per
prompt of a generation; one unit without a tensor), and gives each call

    deadline = min(configured, max(configured / 10, 10 x expected + the calls still in flight))

where expected is the slowest recent rate times this call's work, and the calls in flight before it
on the same service add their own deadlines (a service runs its calls one after another, so a call
may wait behind them). Only the step's calls are measured (`STEP_METHODS`: their time follows their batch); the others
(checkpoints, weight syncs, configuration) may wait on disk or on a save in flight and get the
configured timeout. A method with nothing measured, and each method's first call to a service
process (it may compile or fill caches: a restarted service too), get the configured timeout
(services.rpc_timeout_s) and are not measured.

A call that ran its whole deadline leaves an `Overdue` record, which the controller's supervisor
reads to tell a hung service (its health still answers) from a dead one.

Deliberately not here: what a late call leads to (controller/recovery.py).
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.message import Message

KEPT = 8  # recent calls per method whose rates count
MULTIPLIER = 10.0  # a loaded machine may run a call several times slower than the calls before it
FLOOR_FRACTION = 0.1  # of the configured timeout: short calls vary more than their work says
TENSOR = "tandem.v1.Tensor"
STEP_METHODS = frozenset({
    "ActorService.ComputeLogProb", "ActorService.UpdateActor", "ActorService.TrainSft",
    "RolloutService.GenerateSequences", "CriticService.ComputeValues", "CriticService.UpdateCritic"})


def work_of(request: Message) -> float:
    """Units of work in `request`: elements of its largest tensor (a batch's rows x tokens) times
    `sampling.n` for a generation (samples per prompt); 1 when it carries no tensor."""
    largest = max((math.prod(t.shape) for t in _tensors(request)), default=0)
    samples = getattr(getattr(request, "sampling", None), "n", 0) or 1
    return float(max(largest, 1) * samples)


def _tensors(msg: Message):
    for field, value in msg.ListFields():
        if field.message_type is None or field.message_type.full_name.startswith("google.protobuf."):
            continue  # scalars, bytes, meta Structs
        for item in (value if field.is_repeated else [value]):
            if field.message_type.full_name == TENSOR:
                yield item
            else:
                yield from _tensors(item)


@dataclass(frozen=True)
class Overdue:
    """A call that ran past its deadline."""

    method: str  # Service.Method
    deadline_s: float
    expected_s: float | None  # None: nothing measured, the deadline was the configured timeout

    def describe(self) -> str:
        """'did not answer ActorService.UpdateActor within 60 s (expected ~1.2 s)'."""
        expected = (f"expected ~{self.expected_s:.2g} s" if self.expected_s is not None
                    else "the configured timeout: nothing measured yet")
        return f"did not answer {self.method} within {self.deadline_s:.3g} s ({expected})"


@dataclass
class Call:
    """One call in flight: what its deadline was made of, and when it began."""

    method: str
    work: float
    deadline_s: float
    expected_s: float | None
    measured: bool  # it counts towards its method's rate when it succeeds
    started: float


class CallDeadlines:
    """The deadlines of one service's calls (see the module doc)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, measured=STEP_METHODS) -> None:
        self._clock = clock
        self._measured = measured
        self._rates: dict[str, deque[float]] = {}  # method -> seconds per unit of work
        self._warm: set[str] = set()  # methods the current process has run once
        self._in_flight: list[Call] = []
        self.overdue: Overdue | None = None  # the last call that ran its whole deadline

    def start(self, method: str, request: Message, configured_s: float) -> Call:
        """A call of `method` (Service.Method) starting now -> its deadline; `finish` it after."""
        work = work_of(request)
        rates = self._rates.get(method)
        warm = method in self._warm
        self._warm.add(method)
        if method not in self._measured:
            call = Call(method, work, configured_s, None, False, self._clock())
        elif not warm or not rates:
            call = Call(method, work, configured_s, None, warm, self._clock())
        else:
            expected = max(rates) * work
            ahead = sum(c.deadline_s for c in self._in_flight)
            deadline = min(configured_s, max(configured_s * FLOOR_FRACTION, MULTIPLIER * expected + ahead))
            call = Call(method, work, deadline, expected, True, self._clock())
        self._in_flight.append(call)
        return call

    def finish(self, call: Call, ok: bool, late: bool = False) -> None:
        """`call` ended: `ok` (its duration is measured), or failed (`late`: DEADLINE_EXCEEDED)."""
        self._in_flight.remove(call)
        seconds = self._clock() - call.started
        if ok and call.measured:
            self._rates.setdefault(call.method, deque(maxlen=KEPT)).append(seconds / call.work)
        if late and seconds >= call.deadline_s * 0.99:  # ours, not a deadline the service reported
            self.overdue = Overdue(call.method, call.deadline_s, call.expected_s)

    def process_restarted(self) -> None:
        """The service is a new process: each method's next call is its first again (rates stay:
        the model and the work are the same)."""
        self._warm.clear()
        self.overdue = None
