"""Which state of a model worker lives on the device in which phase, and the moves between phases.

A worker declares its state groups (a model's parameters, its gradient buffers, its optimizer
state, the generation engine's KV cache) and, for each phase of its work (`generate`,
`log_probs`, `train`, ...), which groups that phase uses. Entering a phase first moves out every
group the phase does not use whose offload key is on, then moves in every group it uses that is
out: a group leaves the device only when something else needs the room, so two calls in a row
that use it (a generation, then old log-probs) move nothing. A worker that shares its GPU with
other processes (the critic; a standalone actor) also enters `idle` after each call, so that its
offloaded groups leave the device between calls (verl's behaviour) and the memory goes back to
the driver. verl's keys map to groups: `param_offload` (parameters, pinned host memory),
`grad_offload` (gradient buffers, dropped: every mini-batch zeroes them anyway),
`optimizer_offload` (fp32 main weights and Adam moments, pinned host memory). A phase may declare
groups it only reads (`reads_only`): a group that no other phase used since it came back leaves
without being copied again (the frozen reference, 15 GB at 7B, once per step). A call that knows
which phase comes next may `prefetch` a group: its copies start at once, beside the current phase's
work, and the phase that uses it waits for them on the device only.

Deliberately not here: how bytes move (offload.py); which phases a role has (its worker).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tandem.parallel import device
from tandem.train.offload import HostStash, distinct_storages

IDLE = "idle"


@dataclass
class StateGroup:
    name: str
    offload: bool  # the group's offload key: it leaves the device in phases that do not use it
    move_out: Callable[[], object]
    move_in: Callable[[], object]
    on_device: bool = True
    before_out: list[Callable[[], object]] = field(default_factory=list)  # e.g. release CUDA graphs on it
    stash: HostStash | None = None  # where its bytes wait, for groups that are copied out
    # how it leaves when no phase wrote it since it came in (None: as move_out): its host copy is still good
    unchanged_out: Callable[[], object] | None = None
    written: bool = True  # a phase that may write it ran since it last came in (or it never left)
    # moves in without the current stream waiting (None: it cannot), and `ready` makes the stream wait
    start_in: Callable[[], object] | None = None
    ready: Callable[[], object] | None = None
    in_flight: bool = False  # started in by `prefetch`; no phase that uses it has waited for it yet


class MemoryPhases:
    """A worker's state groups and its current phase; `phase(name)` around every call."""

    def __init__(self, uses: dict[str, set[str]], idle_after_call: bool = False,
                 reads_only: dict[str, set[str]] | None = None):
        self.uses = {**uses, IDLE: set()}
        self.reads_only = reads_only or {}  # phase -> the groups it uses but never writes
        self.idle_after_call = idle_after_call
        self.groups: dict[str, StateGroup] = {}
        self.current = IDLE

    def add(self, group: StateGroup) -> StateGroup:
        if group.name in self.groups:
            raise ValueError(f"state group {group.name!r} is already registered")
        self.groups[group.name] = group
        return group

    def enter(self, phase: str) -> None:
        if phase not in self.uses:
            raise ValueError(f"unknown phase {phase!r}; known: {sorted(self.uses)}")
        with torch.profiler.record_function(f"tandem.phase.{phase}"):  # the moves, a range of their own in traces
            self._enter(phase)

    def _enter(self, phase: str) -> None:
        used = self.uses[phase]
        moved_out = False
        for g in self.groups.values():  # first make room
            if g.offload and g.on_device and g.name not in used:
                for fn in g.before_out:
                    fn()
                (g.unchanged_out if g.unchanged_out is not None and not g.written else g.move_out)()
                g.on_device, g.in_flight, moved_out = False, False, True
        for g in (g for g in self.groups.values() if g.name in used):
            if not g.on_device:
                g.move_in()
                g.on_device, g.written = True, False
            if g.in_flight:
                g.ready()
                g.in_flight = False
            if g.name not in self.reads_only.get(phase, ()):
                g.written = True
        if moved_out and phase == IDLE:
            device.empty_cache()  # other processes on this GPU get the memory
        self.current = phase

    def prefetch(self, name: str) -> None:
        """Start moving group `name` in now, for a later phase of this call: its copies overlap the
        current phase's work (the reference's, the old log-prob pass). A no-op where it is on the device
        or cannot move in asynchronously (it then comes in when its phase starts)."""
        g = self.groups[name]
        if g.on_device or g.start_in is None:
            return
        g.start_in()
        g.on_device, g.written, g.in_flight = True, False, True

    @contextlib.contextmanager
    def phase(self, name: str):
        """Enter `name` for the duration of a call (and `idle` after it when idle_after_call)."""
        self.enter(name)
        try:
            yield
        finally:
            if self.idle_after_call:
                self.enter(IDLE)

    def drop(self) -> None:
        """The worker is being discarded (its run released): the stashed bytes and the pinned host
        buffers go now, not when the last reference to the worker does; the phases are not used after."""
        for g in self.groups.values():
            if g.stash is not None:
                g.stash.drop()
        device.empty_host_cache()

    def where(self) -> dict[str, str]:
        """{group: 'device' | 'host'} (a dropped gradient buffer counts as 'host')."""
        return {name: "device" if g.on_device else "host" for name, g in self.groups.items()}


# ---- the groups model workers have --------------------------------------------------------------

def params_group(name: str, model, offload: bool) -> StateGroup:
    """A model's parameters, stashed in (pinned) host memory while out; when only read since they came
    back (the reference in its log-prob pass), they leave without a copy: the host still has them."""
    stash = HostStash()

    def move_out(unchanged: bool = False):
        return stash.offload(distinct_storages(model.parameters()), unchanged=unchanged)

    return StateGroup(name, offload, move_out, lambda: stash.reload(wait=True), stash=stash,
                      unchanged_out=lambda: move_out(unchanged=True), start_in=lambda: stash.reload(wait=False),
                      ready=stash.ready)


def grads_group(ddp, offload: bool) -> StateGroup:
    """megatron DDP's gradient buffers, dropped while out (megatron-core's own
    offload_grad_buffers / restore_grad_buffers: freed, then reallocated zeroed)."""
    return StateGroup("grads", offload, lambda: ddp.offload_grad_buffers(synchronize=True, empty_cache=False),
                      lambda: ddp.restore_grad_buffers(synchronize=False))


def optimizer_group(optimizers: Callable[[], list], model, offload: bool) -> StateGroup:
    """The state of `optimizers()` (tandem.train.optim.Optimizer: fp32 main weights, Adam moments,
    never the model's own weights), stashed in (pinned) host memory while out. Moving in does not
    wait: the copies overlap the first mini-batch's forward and backward, and each optimizer waits
    for them just before its first step (`Optimizer.before_step`)."""
    stash = HostStash()

    def move_out():
        tensors = [t for opt in optimizers() for t in opt.state_tensors()]
        stash.offload(distinct_storages(tensors, exclude=model.parameters()))

    def move_in():
        stash.reload(wait=False)
        for opt in optimizers():
            opt.before_step = stash.ready

    return StateGroup("optimizer", offload, move_out, move_in, stash=stash)
