"""How the controller gets its services: the `Launcher` interface and the registry of launchers.

A launcher starts the service processes a run needs, waits until each one serves, and
returns their endpoints; at the end it stops them. The controller talks to this interface
only, so where the services run (local processes today; containers or Ray actors later)
is one file under controller/launchers/ plus one line in `LAUNCHERS`; `trainer.launcher` picks
one (`local`: child processes; `compose`: containers that docker compose started; `ray`: Ray
actors placed by placement groups). How a service process is started (argv, environment) is
controller/launchers/commands.py, shared by all of them.

Services given an endpoint in the config (`services.<role>.endpoint`) are attached to,
whatever the launcher: `endpoints` asks the launcher only for the others.

Deliberately not here: the clients that talk to the services (controller/roles.py).
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tandem.config import TandemConfig


@dataclass(frozen=True)
class LaunchContext:
    """What every launcher needs to start a run's services."""

    config_path: str  # the run's resolved config.yaml; every service starts from it
    run_dir: str  # logs/<role>.log go under it
    run_id: str  # each service tags its logs with it
    startup_timeout_s: float  # how long a service may take to report SERVING
    hosts: Mapping[str, str] = field(default_factory=dict)  # role -> the address it binds (default 127.0.0.1)
    cfg: TandemConfig | None = None  # the run's config (world sizes, Ray placement)


class Launcher(ABC):
    """Starts a run's services and stops them. One instance per run (or per config file)."""

    def __init__(self, ctx: LaunchContext):
        self.ctx = ctx

    @abstractmethod
    async def start(self, roles: Sequence[str]) -> dict[str, str]:
        """Start a service for each role and wait until all serve -> {role: "host:port"}.

        Raises (after which `stop` still cleans up what was started) when a service exits
        while starting or is not serving within `ctx.startup_timeout_s`."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every service this launcher started (gracefully, then by force). Safe to call twice."""

    async def restart(self, role: str, hung: bool = False) -> str:
        """Start `role` again after it died, or hung (`hung`: it still runs but does not answer its
        calls), and wait until it serves -> its new endpoint. What is left of it (its other ranks,
        a hung process) is stopped first. The restarted service takes the run's config as at the
        first start (crash recovery, controller/recovery.py)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart the {role} service yet")

    def is_running(self, role: str) -> bool | None:
        """Whether the service this launcher started for `role` is still running; None when
        this launcher cannot tell (the controller then asks the service's health check)."""
        return None

    def describe(self, role: str) -> str:
        """How `role`'s service is or ended, and where its log is, for error messages."""
        return "no details from this launcher"


# name -> "module:class", imported only when picked
LAUNCHERS: dict[str, str] = {
    "local": "tandem.controller.launchers.local:LocalLauncher",
    "compose": "tandem.controller.launchers.compose:ComposeLauncher",
    "ray": "tandem.controller.launchers.ray:RayLauncher",
}
DEFAULT_LAUNCHER = "local"


def get_launcher(name: str) -> type[Launcher]:
    """The launcher class registered as `name`; ValueError naming the known ones otherwise."""
    if name not in LAUNCHERS:
        raise ValueError(f"unknown launcher {name!r}; known launchers: {sorted(LAUNCHERS)}")
    module, _, cls = LAUNCHERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


async def endpoints(launcher: Launcher, roles: Sequence[str],
                    attach: Mapping[str, str | None]) -> dict[str, str]:
    """{role: endpoint} for `roles`: `attach[role]` where given, else started by `launcher`."""
    started = await launcher.start([r for r in roles if not attach.get(r)])
    return {r: attach.get(r) or started[r] for r in roles}
