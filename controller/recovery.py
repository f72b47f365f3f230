"""Crash recovery: the controller watches a run's services and brings the run back when one dies
or hangs.

A `Supervisor` holds a grpc.health.v1 Watch stream on every service of the run and, when a
call fails, asks which services are dead (the launcher's view of the process first, then a
health check) and which are hung: alive, but a call ran past its deadline, measured from the
service's earlier calls (tandem/rpc/deadlines.py; the model services only: a reward call's rows
may each take up to its function's own timeout, so its calls keep reward_model.timeout_s and a
late one fails its rows). A dead or hung service that the run started is restarted by its
launcher and its clients are re-pointed at it (`Roles.repoint`), at most `trainer.max_restarts`
times per run; past that, or for a service the run only attached to, the run stops with an
error naming the service, how it ended (or which call it did not answer) and its log. Then:

- a service with state (actor, critic, standalone rollout) died: `guard` runs the run's
  `recover` (every role back to the latest complete checkpoint, as a resume does) and the
  run's body again from there, so the run stays exactly consistent;
- the reward service (rule verifiers, no state) died: only the failed call is sent again
  (`ServiceClient.resend_after_failure`).

A health stream that ends while the body runs cancels the body at once (a dead actor is
noticed while the controller waits on another service), and a service with state whose stream
ended makes the run go back to its checkpoint even when it answers again (a restart policy, as
compose's, brought it back without the controller). A failure with no dead service
behind it (a bad request, a bug) is raised as it is.

Deliberately not here: how services start (controller/launchers/), what a restore loads
and how the run goes back (controller/run.py, controller/checkpointing.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.controller.launchers import Launcher
from tandem.controller.roles import Roles
from tandem.logging import get_logger
from tandem.rpc.deadlines import CallDeadlines, Overdue

_log = get_logger("controller.recovery")
STATELESS = frozenset({"reward"})  # restarted and the call sent again; no restore
HEALTH_TIMEOUT_S = 10.0  # a busy service still answers health checks (its event loop is free)
EXIT_GRACE_S = 3.0  # a killed process may refuse connections a moment before it is reaped
SERVING = health_pb2.HealthCheckResponse.SERVING


class ServiceLost(Exception):
    """A service's health stream ended while the run's body was running."""


class RunStopped(RuntimeError):
    """A service died and cannot be restarted (restarts used up, or attached by endpoint)."""


class Supervisor:
    """Watches the services of one run and restarts the dead ones (see the module docstring)."""

    def __init__(self, launcher: Launcher, roles: Roles, started: list[str], attached: dict[str, str],
                 max_restarts: int, startup_timeout_s: float,
                 on_restart: Callable[[str, str], None] | None = None):
        self.launcher, self.roles = launcher, roles
        self.started, self.attached = list(started), dict(attached)  # attached: role -> endpoint
        self.max_restarts, self.startup_timeout_s = max_restarts, startup_timeout_s
        self.on_restart = on_restart or (lambda role, why: None)
        self.restarts = 0
        self._watches: dict[str, asyncio.Task] = {}
        self._lost: set[str] = set()
        self._stateful_lost = asyncio.Event()
        self._lock = asyncio.Lock()
        for role in STATELESS & set(started):
            for client in roles.service_clients(role):
                client.resend_after_failure = self._resender(role, client)
        self.deadlines: dict[str, CallDeadlines] = {}  # role -> its calls' measured deadlines
        for role in self.roles_watched:
            if role not in STATELESS:
                self.deadlines[role] = CallDeadlines()
                for client in roles.service_clients(role):
                    client.deadlines = self.deadlines[role]

    @property
    def roles_watched(self) -> list[str]:
        return [*self.started, *self.attached]

    # ---- watching --------------------------------------------------------------------------

    def watch(self) -> None:
        """Start a health stream per service (call once the services serve)."""
        for role in self.roles_watched:
            self._start_watch(role)

    async def close(self) -> None:
        """Stop watching (before the services are stopped on purpose)."""
        for role in list(self._watches):
            await self._stop_watch(role)

    def _start_watch(self, role: str) -> None:
        self._lost.discard(role)
        self._watches[role] = asyncio.ensure_future(self._watch(role))

    async def _stop_watch(self, role: str) -> None:
        task = self._watches.pop(role, None)
        if task is not None:
            task.cancel()
            # bounded, and our own cancellation still propagates (awaiting the task under
            # suppress(CancelledError) would swallow it, and wait forever on a stream that never ends)
            await asyncio.wait({task}, timeout=5.0)
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: a watch that failed as it was stopped is of no interest

    async def _watch(self, role: str) -> None:
        stub = health_pb2_grpc.HealthStub(self.roles.service_clients(role)[0].channel)
        try:
            async for resp in stub.Watch(health_pb2.HealthCheckRequest(service="")):
                if resp.status != SERVING:
                    break
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:  # an attached service without health
                _log.info("service.no_health_stream", role=role)  # streams: its calls still tell
                return
        _log.warning("service.health_lost", role=role)
        self._lost.add(role)
        if role not in STATELESS:
            self._stateful_lost.set()

    # ---- who is dead -----------------------------------------------------------------------

    async def is_dead(self, role: str) -> bool:
        """The process ended, or the service refuses connections (or says NOT_SERVING) for
        EXIT_GRACE_S. A service that is slow to answer is not dead."""
        client = self.roles.service_clients(role)[0]
        deadline = time.monotonic() + EXIT_GRACE_S
        while True:
            if role in self.started and self.launcher.is_running(role) is False:
                return True
            try:
                resp = await health_pb2_grpc.HealthStub(client.channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=HEALTH_TIMEOUT_S)
                if resp.status == SERVING:
                    return False
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    return False  # e.g. DEADLINE_EXCEEDED: busy, not proven dead
            if time.monotonic() > deadline:
                return True
            await asyncio.sleep(0.2)

    async def dead_roles(self) -> list[str]:
        dead = await asyncio.gather(*(self.is_dead(r) for r in self.roles_watched))
        return [r for r, d in zip(self.roles_watched, dead) if d]

    def hung_roles(self, dead: list[str]) -> dict[str, Overdue]:
        """{role: its call that ran its whole deadline} of the services that are not dead."""
        return {r: d.overdue for r, d in self.deadlines.items() if d.overdue is not None and r not in dead}

    # ---- restarting ------------------------------------------------------------------------

    async def restart(self, role: str, cause: BaseException, counted: bool = True,
                      hung: Overdue | None = None) -> None:
        """Start `role`'s service again (the launcher stops what is left of it first) and point its
        clients at it; `counted` restarts come out of trainer.max_restarts (a deliberate reset does
        not); `hung`: the call it did not answer (it is alive), else it died."""
        if role not in self.started:
            lost = hung.describe() if hung else f"stopped answering ({cause})"
            raise RunStopped(f"the {role} service at {self.attached.get(role)} {lost}; it was attached "
                             f"(services.{role}.endpoint), not started by this run, so Tandem cannot restart it") from cause
        why = self.launcher.describe(role)
        what = hung.describe() if hung else f"died ({why})"
        last = "" if hung else f" (last call: {cause})"  # a hung one's last call is the one it did not answer
        if counted and self.restarts >= self.max_restarts:
            raise RunStopped(f"the {role} service {what}{last} and the run has used its "
                             f"trainer.max_restarts={self.max_restarts} restarts") from cause
        await self._stop_watch(role)
        if counted:
            self.restarts += 1
            print(f"tandem: the {role} service {what}; restarting it (restart {self.restarts} of "
                  f"{self.max_restarts})", flush=True)
            _log.warning("service.restart", role=role, why=why, hung=hung.describe() if hung else None,
                         restarts=self.restarts, cause=str(cause))
        try:
            endpoint = await self.launcher.restart(role, hung=hung is not None)
        except NotImplementedError as e:  # a launcher without restarts: the run ends here
            raise RunStopped(f"the {role} service {what}{last} and {e}") from cause
        await self.roles.repoint(role, endpoint)
        await self.roles.service_clients(role)[0].wait_healthy(timeout_s=self.startup_timeout_s)
        self._start_watch(role)
        if not self._lost - STATELESS:
            self._stateful_lost.clear()
        if counted:
            self.on_restart(role, why)

    def _resender(self, role: str, client) -> Callable[..., Awaitable[bool]]:
        """The reward client's hook: its service died -> restart it, send the call again."""
        async def resend(err: BaseException, endpoint: str) -> bool:
            async with self._lock:
                if client.endpoint != endpoint:  # another call restarted it meanwhile
                    return True
                if not await self.is_dead(role):
                    return False
                await self.restart(role, err)
                return True
        return resend

    # ---- the run's body --------------------------------------------------------------------

    async def guard(self, body: Callable[[], Awaitable[None]], recover: Callable[[], Awaitable[None]]) -> None:
        """Run `body()` to its end. When it fails because services died or hung: restart them,
        `recover()` (the run goes back to its latest checkpoint), run `body()` again."""
        recovering = False
        while True:
            try:
                if recovering:
                    await recover()
                return await self._until_lost(body)
            except Exception as err:  # noqa: BLE001 - anything but a dead or hung service is raised again below
                dead = await self.dead_roles()
                hung = self.hung_roles(dead)
                # a service with state whose health stream ended went away, even if it answers again by
                # now (compose's restart policy brought it back): its state is gone, so the run goes back
                if not dead and not hung and not self._lost - STATELESS and not isinstance(err, ServiceLost):
                    raise
                async with self._lock:
                    for role in dead:
                        await self.restart(role, err)
                    for role, late in hung.items():
                        await self.restart(role, err, hung=late)
                    for role in list(self._lost):  # a stream ended but the service lives: watch again
                        if self._watches[role].done():
                            self._start_watch(role)
                    self._stateful_lost.clear()
                recovering = True

    async def _until_lost(self, body: Callable[[], Awaitable[None]]) -> None:
        """`body()`, cancelled as soon as a service with state ends its health stream."""
        work = asyncio.ensure_future(body())
        lost = asyncio.ensure_future(self._stateful_lost.wait())
        try:
            done, _ = await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            work.cancel()
            raise
        finally:
            lost.cancel()
        if work in done:
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        raise ServiceLost(f"services stopped serving: {sorted(self._lost)}")
