"""The local launcher: each service a child process on this machine (what `tandem run` uses).

A service is started with controller/launchers/commands.py's command (`python -m
tandem.services.<role> --config RUN/config.yaml --host H --port 0 --port-file RUN/logs/<role>.port
--run-id ID`, H = `services.<role>.host`, with `--allow-dir` for the directory of the run's own
reward function and `--insecure` when `services.insecure`); it binds a free port and writes it to
the port file once SERVING. Its stdout and stderr go to RUN/logs/<role>.log. Services run in their own
session, so Ctrl-C reaches only the controller, which then stops them; a controller killed
outright (SIGKILL, out of memory) cannot, so each service also stops itself once its parent is
gone (TANDEM_PARENT_PID, tandem/rpc/server.py).

`restart(role)` kills what is left of a service (its process group: every rank) and starts
it again the same way; the launcher keeps each role's current process.

Deliberately not here: attaching to running services (controller/launchers/__init__.py
leaves those roles out), health checks over gRPC (the clients wait for those), deciding
when to restart (controller/recovery.py).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Sequence

from tandem.controller.launchers import LaunchContext, Launcher
from tandem.controller.launchers.commands import connect_host, devices_env, service_argv, service_env, service_of
from tandem.controller.launchers.start_failure import how_it_ended, start_failed
from tandem.logging import get_logger
from tandem.rpc.server import PARENT_PID_ENV
from tandem.serving.allowed_dirs import code_dirs

_log = get_logger("controller.launchers.local")


class LocalLauncher(Launcher):
    """Services as child processes; each binds services.<role>.host (127.0.0.1 by default)."""

    def __init__(self, ctx: LaunchContext):
        super().__init__(ctx)
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, str] = {}
        self._logs_dir = os.path.join(ctx.run_dir, "logs")

    async def start(self, roles: Sequence[str]) -> dict[str, str]:
        os.makedirs(self._logs_dir, exist_ok=True)
        for role in roles:  # all spawned before the first wait, so they start in parallel
            self._spawn(role)
        return await self._wait_ready(list(roles))

    def _port_file(self, role: str) -> str:
        return os.path.join(self._logs_dir, f"{role}.port")

    def _spawn(self, role: str) -> None:
        port_file = self._port_file(role)
        if os.path.exists(port_file):
            os.unlink(port_file)
        log_path = os.path.join(self._logs_dir, f"{role}.log")
        cfg = self.ctx.cfg
        cmd = service_argv(role, self.ctx.config_path, host=self._host(role), port_file=port_file,
                           run_id=self.ctx.run_id, allow_dirs=code_dirs(cfg) if cfg else (),
                           insecure=bool(cfg and cfg.services.insecure))
        env = dict(os.environ, **service_env(), **devices_env(self.ctx.cfg, role))
        env[PARENT_PID_ENV] = str(os.getpid())  # it stops itself if we die without stopping it
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            self.processes[role] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                                    start_new_session=True)  # Ctrl-C reaches us only
        self.logs[role] = log_path
        _log.info("service.started", role=role, pid=self.processes[role].pid, log=log_path)

    def _host(self, role: str) -> str:
        return self.ctx.hosts.get(service_of(role), "127.0.0.1")

    async def _wait_ready(self, roles: list[str]) -> dict[str, str]:
        """Wait for each role's port file; fail fast if one exits."""
        deadline = time.monotonic() + self.ctx.startup_timeout_s
        endpoints: dict[str, str] = {}
        pending = set(roles)
        while pending:
            for role in list(pending):
                proc, port_file = self.processes[role], self._port_file(role)
                if proc.poll() is not None:
                    raise start_failed(role, f"exited with code {proc.returncode}", self.logs[role])
                if os.path.exists(port_file):
                    with open(port_file) as f:
                        endpoints[role] = f"{connect_host(self._host(role))}:{int(f.read().strip())}"
                    pending.discard(role)
            if pending and time.monotonic() > deadline:
                role = sorted(pending)[0]
                raise start_failed(role, f"not serving after services.startup_timeout_s="
                                   f"{self.ctx.startup_timeout_s:g}", self.logs[role])
            await asyncio.sleep(0.2)
        return endpoints

    async def restart(self, role: str, hung: bool = False) -> str:
        if role not in self.processes:
            raise ValueError(f"no {role} service was started by this launcher; started: {sorted(self.processes)}")
        self._kill(role)
        self._spawn(role)
        return (await self._wait_ready([role]))[role]

    def is_running(self, role: str) -> bool | None:
        proc = self.processes.get(role)
        return None if proc is None else proc.poll() is None

    def describe(self, role: str) -> str:
        proc = self.processes.get(role)
        if proc is None or proc.poll() is None:
            state = "running" if proc is not None else "not started"
        else:
            state = how_it_ended(proc.returncode)
        return f"{state}; log {self.logs.get(role, '-')}"

    def _kill(self, role: str) -> None:
        """SIGKILL the role's whole process group (rank 0 started it as a session leader and its
        other ranks inherit the group), then reap rank 0."""
        proc = self.processes[role]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # already gone
        proc.wait()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every started service, then SIGKILL what is left after the grace period, and
        whatever is still in their process groups."""
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for role, proc in self.processes.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _log.warning("service.kill", role=role, pid=proc.pid)
                proc.kill()
                proc.wait()
        for proc in self.processes.values():  # what the services left in their groups: a rank that lost
            try:  # its rank 0, the process a library spawned (megatron's async-checkpoint Manager)
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # the group is empty
