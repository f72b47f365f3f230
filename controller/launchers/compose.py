"""The compose launcher: services that docker compose started, found by their compose names.

deploy/compose.yaml (generated from controller/launchers/commands.py by compose_file.py) runs
each role as a container named after the role (`actor`, `reward`, ...; the CPU profile's
`actor-cpu` answers to `actor` too) on a fixed port (commands.PORTS), next to a controller
container that runs `tandem run` with `trainer.launcher=compose`. This launcher starts nothing:
it waits until each role the run needs answers SERVING at `<role>:<port>` (grpc health) and
returns those endpoints; a role that never does is an error naming the compose service and
profile that provide it. `services.<role>.endpoint` still wins (controller/launchers/__init__.py).

Restarts: every role's container has `restart: on-failure`, so compose starts a service again when
it exits with an error (killed, out of memory, a lost rank). `restart(role)` starts nothing either:
it waits, up to services.startup_timeout_s, until the service answers SERVING again at its compose
address (the controller calls it once the service was seen dead, so what answers is the new container)
and returns that address (a container that `docker kill` or `docker stop` ended is not restarted by
Docker: the wait and the error name `docker compose start`); the controller then goes back to its checkpoint. A hung
service cannot be restarted from here (compose restarts only a container that exits): `restart`
says so and the run stops with that error.

Deliberately not here: starting or stopping containers (`docker compose up` / `down` own their
lifetime, so `stop` leaves them running).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.controller.launchers import LaunchContext, Launcher
from tandem.controller.launchers.commands import PORTS
from tandem.controller.launchers.start_failure import ServiceStartFailed

POLL_S = 1.0  # a (re)started container loads its model before it answers: seconds, not milliseconds
# the compose profiles that run each role (the GPU profile's names; `cpu` likewise)
PROFILE = {"actor": "gpu", "reward": "gpu", "rollout": "gpu-ppo", "critic": "gpu-ppo"}


def compose_address(role: str) -> str:
    """Where a role's compose service answers on the compose network."""
    return f"{role}:{PORTS[role]}"


async def _serving(target: str, timeout_s: float = 2.0) -> bool:
    async with grpc.aio.insecure_channel(target) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


class ComposeLauncher(Launcher):
    """Containers started by `docker compose up`; endpoints `<role>:<port>` (see module doc)."""

    def __init__(self, ctx: LaunchContext, address: Callable[[str], str] = compose_address):
        super().__init__(ctx)
        self._address = address

    async def start(self, roles: Sequence[str]) -> dict[str, str]:
        found = {role: self._address(role) for role in roles}
        deadline = time.monotonic() + self.ctx.startup_timeout_s
        pending = dict(found)
        while pending:
            for role, target in list(pending.items()):
                if await _serving(target):
                    del pending[role]
            if not pending:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("; ".join(
                    f"the {role} service is not serving at {target} after {self.ctx.startup_timeout_s:g}s "
                    f"(its compose service runs in profile {PROFILE[role]} or "
                    f"{PROFILE[role].replace('gpu', 'cpu')}: add `--profile ...` to `docker compose up`)"
                    for role, target in sorted(pending.items())))
            await asyncio.sleep(POLL_S)
        return found

    def stop(self) -> None:
        """Nothing: the containers belong to compose (`docker compose down` stops them)."""

    async def restart(self, role: str, hung: bool = False) -> str:
        target = self._address(role)
        if hung:
            raise NotImplementedError(f"the compose launcher cannot stop a hung service (compose restarts a container "
                                      f"only when it exits): `docker compose restart {role}`, then resume the run "
                                      "(trainer.resume_mode=auto)")
        # Docker restarts a container that exited with an error, not one a person stopped: `docker kill`
        # and `docker stop` end its restart policy until it is started again
        service = role if role == "reward" else f"{role}, or {role}-cpu under the cpu profiles"
        hint = ("a container stopped by `docker kill` or `docker stop` is not restarted: `docker compose start "
                f"SERVICE` brings it back (SERVICE: {service}; its log: `docker compose logs SERVICE`)")
        print(f"tandem: waiting up to {self.ctx.startup_timeout_s:g}s for compose to restart the {role} service "
              f"({hint})", flush=True)
        deadline = time.monotonic() + self.ctx.startup_timeout_s
        while not await _serving(target):
            if time.monotonic() > deadline:
                raise ServiceStartFailed(
                    f"the {role} service did not come back at {target} within services.startup_timeout_s="
                    f"{self.ctx.startup_timeout_s:g} (compose restarts its container when it exits with an error: "
                    f"`restart: on-failure` in deploy/compose.yaml; {hint})")
            await asyncio.sleep(POLL_S)
        return target
