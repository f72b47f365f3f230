"""The controller's pool of long-lived services (one per role), and the launcher that lends them to a run.

`ServicePool` holds an endpoint per role: a service given to `tandem serve --service
ROLE=HOST:PORT` (attached: never started or stopped here), or one this controller started as
a local process without a run config (`python -m tandem.services.<role> --port-file ...`: it holds
no run until Configure). Started services run in their own session, so they outlive a
controller that is killed; their endpoints and pids are kept in STATE_DIR/services/pool.json,
and a restarted controller reattaches to those still alive instead of starting new ones. Every
service the pool starts requires the pool's token (STATE_DIR/services/pool.token, made once,
mode 0600; `security`), and imports code a run names only from `tandem serve --allow-dir`.

`PoolLauncher` is a run's view of the pool, behind the same Launcher interface that
`tandem run`'s local launcher has: `start(roles)` configures each role's service with the
run's config.yaml (starting the service first when the pool has none), `stop()` releases them.

Deliberately not here: which run goes next (controller/service/queue.py), the run itself.
"""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

import psutil

from tandem.config import TandemConfig
from tandem.controller.clients import LifecycleClient, release_now
from tandem.controller.launchers import LaunchContext, Launcher
from tandem.controller.launchers.commands import ROLES, long_lived_argv, service_env, service_of
from tandem.controller.launchers.start_failure import start_failed
from tandem.logging import get_logger
from tandem.rpc.auth import read_token
from tandem.rpc.errors import TandemError
from tandem.rpc.security import PLAINTEXT, EndpointSecurity

_log = get_logger("controller.service.pool")
POOL_FILE = "pool.json"
TOKEN_FILE = "pool.token"  # every service the pool starts requires the token it holds


class ServicePool:
    def __init__(self, state_dir: str, attach: dict[str, str] | None = None, startup_timeout_s: float = 300.0,
                 rpc_timeout_s: float = 600.0, allow_dirs: list[str] | None = None):
        """allow_dirs: where a run's config may name Python files for the services to import."""
        self.dir = os.path.join(state_dir, "services")
        os.makedirs(self.dir, exist_ok=True)
        self.token_file = _pool_token(os.path.join(self.dir, TOKEN_FILE))
        self.allow_dirs = list(allow_dirs or [])
        self.attached = dict(attach or {})
        self.endpoints: dict[str, str] = dict(self.attached)
        self.started: dict[str, int] = {}  # role -> pid of a service this controller (or its predecessor) started
        self.holders: dict[str, str] = {}  # role -> the run it was configured for
        self.startup_timeout_s, self.rpc_timeout_s = startup_timeout_s, rpc_timeout_s
        self._lock = threading.Lock()

    # ---- who may call them -----------------------------------------------------------------------

    def security(self, role: str) -> EndpointSecurity:
        """How to call `role`'s service: with the pool's token when the pool started it; an attached
        one as the run's own config says (plaintext here)."""
        if role in self.attached:
            return PLAINTEXT
        return EndpointSecurity(token=read_token(self.token_file, None, "pool"))

    def with_tokens(self, cfg: TandemConfig) -> TandemConfig:
        """`cfg` calling every service the pool starts with the pool's token (services.<role>.auth),
        the services' calls to each other (the weight plane) included."""
        for role in ROLES:
            if role not in self.attached:
                auth = getattr(cfg.services, role).auth
                auth.token_file, auth.token_env = self.token_file, None
        return cfg

    # ---- starting, reattaching, stopping ------------------------------------------------------

    def reattach(self) -> dict[str, int]:
        """Take over the services a previous controller started that are still alive -> {role: pid}."""
        try:
            with open(os.path.join(self.dir, POOL_FILE)) as f:
                saved = json.load(f)
        except (OSError, ValueError):
            return {}
        for role, entry in saved.items():
            if role not in self.attached and _is_service(entry.get("pid"), role):
                self.endpoints[role], self.started[role] = entry["endpoint"], entry["pid"]
        self._save()
        return dict(self.started)

    async def reclaim(self) -> dict[str, str]:
        """Give back whatever run the pool's services still hold (their controller died) -> {role: run}.
        A started service that does not answer is dropped (the next run that needs it starts another)."""
        freed = {}
        for role, endpoint in list(self.endpoints.items()):
            try:
                async with LifecycleClient(endpoint, timeout_s=self.rpc_timeout_s, security=self.security(role)) as client:
                    held = (await client.describe())["run_id"]
                    if held:
                        await client.interrupt(held)  # a generation of the dead run stops early
                        freed[role] = await client.release(held)
            except TandemError as e:
                if role in self.attached:
                    raise
                _log.warning("pool.dropped", role=role, endpoint=endpoint, error=str(e))
                self._forget(role)
        return freed

    def _forget(self, role: str) -> None:
        with self._lock:
            self.endpoints.pop(role, None)
            pid = self.started.pop(role, None)
            if (p := _process(pid)) is not None and _is_service(pid, role):
                p.kill()
            self._save()

    async def ensure(self, roles: Sequence[str]) -> dict[str, str]:
        """An endpoint for each role, starting (and waiting for) the services the pool lacks."""
        for role in roles:  # a started service that has died since (crash, OOM) is started again
            if role in self.started and not _is_service(self.started[role], role):
                _log.warning("pool.service_gone", role=role, pid=self.started[role])
                self._forget(role)
        with self._lock:
            missing = [r for r in roles if r not in self.endpoints]
            procs = {r: self._spawn(r) for r in missing}
        if procs:
            found = await self._wait_ready(procs)
            with self._lock:
                self.endpoints.update(found)
                self.started.update({r: p.pid for r, p in procs.items()})
                self._save()
        return {r: self.endpoints[r] for r in roles}

    def _port_file(self, role: str) -> str:
        return os.path.join(self.dir, f"{role}.port")

    def _spawn(self, role: str) -> subprocess.Popen:
        port_file = self._port_file(role)
        if os.path.exists(port_file):
            os.unlink(port_file)
        cmd = long_lived_argv(role, host="127.0.0.1", port_file=port_file, token_file=self.token_file,
                              allow_dirs=self.allow_dirs)
        env = dict(os.environ, **service_env())
        with open(os.path.join(self.dir, f"{role}.log"), "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # outlives a controller that is killed
        _log.info("pool.started", role=role, pid=proc.pid)
        return proc

    async def _wait_ready(self, procs: dict[str, subprocess.Popen]) -> dict[str, str]:
        deadline = time.monotonic() + self.startup_timeout_s
        found: dict[str, str] = {}
        while len(found) < len(procs):
            for role, proc in procs.items():
                if role in found:
                    continue
                if proc.poll() is not None:
                    raise start_failed(role, f"exited with code {proc.returncode}",
                                       os.path.join(self.dir, f"{role}.log"))
                if os.path.exists(self._port_file(role)):
                    with open(self._port_file(role)) as f:
                        found[role] = f"127.0.0.1:{int(f.read().strip())}"
            if len(found) < len(procs) and time.monotonic() > deadline:
                raise TimeoutError(f"services {sorted(set(procs) - set(found))} not serving after "
                                   f"{self.startup_timeout_s:g}s; see {self.dir}")
            await asyncio.sleep(0.2)
        return found

    def _save(self) -> None:
        entries = {r: {"endpoint": self.endpoints[r], "pid": pid} for r, pid in self.started.items()}
        tmp = os.path.join(self.dir, POOL_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(entries, f)
        os.replace(tmp, os.path.join(self.dir, POOL_FILE))

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the services this pool started, SIGKILL what is left after the grace period."""
        procs = [p for pid in self.started.values() if (p := _process(pid)) is not None]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            p.kill()
        self.started.clear()
        self._save()

    # ---- what a run does with the pool ----------------------------------------------------------

    async def interrupt(self, run_id: str) -> None:
        """Cut the generations of `run_id` on every service configured for it (cancel)."""
        for role, endpoint in list(self.endpoints.items()):
            if self.holders.get(role) == run_id:
                async with LifecycleClient(endpoint, timeout_s=30, security=self.security(role)) as client:
                    await client.interrupt(run_id)


class PoolLauncher(Launcher):
    """A run's services from the pool: configured for it at start, released at stop."""

    def __init__(self, ctx: LaunchContext, pool: ServicePool, on_configured=None):
        super().__init__(ctx)
        self.pool = pool
        self.on_configured = on_configured  # called with `pids` once every role is configured
        self.configured: dict[str, str] = {}  # role -> endpoint
        self.pids: dict[str, list[int]] = {}

    async def start(self, roles: Sequence[str]) -> dict[str, str]:
        endpoints = await self.pool.ensure(roles)
        with open(self.ctx.config_path) as f:
            config_yaml = f.read()

        async def configure(role: str):
            async with LifecycleClient(endpoints[role], timeout_s=self.pool.rpc_timeout_s,
                                       security=self.pool.security(role)) as client:
                pids, _ = await client.configure(self.ctx.run_id, config_yaml)
            self.configured[role], self.pids[role] = endpoints[role], pids
            self.pool.holders[role] = self.ctx.run_id

        results = await asyncio.gather(*(configure(r) for r in roles), return_exceptions=True)
        errors = [e for e in results if isinstance(e, BaseException)]
        if errors:
            raise errors[0]
        if self.on_configured is not None:
            self.on_configured(self.pids)
        return endpoints

    def stop(self) -> None:
        """Release every service configured for this run (each finishes its call in progress first)."""
        for role, endpoint in list(self.configured.items()):
            try:
                release_now(endpoint, self.ctx.run_id, self.pool.rpc_timeout_s, self.pool.security(role))
            except Exception as e:  # noqa: BLE001 - release the others; the next Configure tells
                _log.warning("pool.release_failed", role=role, run=self.ctx.run_id, error=str(e))
            self.pool.holders.pop(role, None)
        self.configured.clear()


def _pool_token(path: str) -> str:
    """The pool's token file, made once per state directory (readable by its owner only), so that
    a restarted controller still holds the token of the services it reattaches to -> its path."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32))
    return path


def _process(pid: int | None) -> psutil.Process | None:
    try:
        return psutil.Process(pid) if pid else None
    except psutil.Error:
        return None


def _is_service(pid: int | None, role: str) -> bool:
    """A live process of `python -m tandem.services.<role>` (not a recycled pid; rollout-1: services.rollout)."""
    p = _process(pid)
    try:
        return p is not None and p.status() != psutil.STATUS_ZOMBIE and f"tandem.services.{service_of(role)}" in p.cmdline()
    except psutil.Error:
        return False
