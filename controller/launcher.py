"""Start the services a run needs as local processes, wait until healthy, stop them.

Each service binds a free port and writes it to a port file once SERVING; its stdout
and stderr go to RUN_DIR/logs/<role>.log. A service given an endpoint in the config
(services.<role>.endpoint) is attached to instead of started. Rollout replicas are roles
`rollout`, `rollout-1`, ... of the one rollout service; `services.<role>.devices` becomes
their CUDA_VISIBLE_DEVICES (replica k takes the k-th group of world_size GPUs when there are
enough for all, else they share them).
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from tandem.logging import get_logger

_log = get_logger("controller.launcher")


@dataclass
class Launched:
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    endpoints: dict[str, str] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def service_of(role: str) -> str:
    """rollout-2 -> rollout (a replica runs its service's module)."""
    return role.split("-", 1)[0]


def attach_endpoints(cfg, roles: list[str]) -> dict[str, str | None]:
    """{role: the endpoint to attach to, or None to start it}; rollout replicas take the
    comma-separated services.rollout.endpoint in order."""
    out = {}
    for role in roles:
        endpoint = getattr(cfg.services, service_of(role)).endpoint
        if endpoint and service_of(role) == "rollout":
            endpoint = endpoint.split(",")[_replica_index(role)].strip()
        out[role] = endpoint
    return out


def _replica_index(role: str) -> int:
    return int(role.split("-", 1)[1]) if "-" in role else 0


def _devices_env(cfg, role: str) -> dict[str, str]:
    if cfg is None:
        return {}
    svc = getattr(cfg.services, service_of(role))
    if svc.devices is None:
        return {}
    ids = [i.strip() for i in str(svc.devices).split(",")]
    if len(ids) > svc.world_size:  # one group of world_size GPUs per replica
        k = _replica_index(role)
        ids = ids[k * svc.world_size:(k + 1) * svc.world_size]
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}


def start(roles: list[str], config_path: str, run_dir: str, run_id: str,
          attach: dict[str, str | None], cfg=None) -> Launched:
    out = Launched()
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    for role in roles:
        if attach.get(role):
            out.endpoints[role] = attach[role]
            continue
        port_file = os.path.join(run_dir, "logs", f"{role}.port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        log_path = os.path.join(run_dir, "logs", f"{role}.log")
        log = open(log_path, "ab")
        cmd = [sys.executable, "-m", f"services.{service_of(role)}", "--config", config_path,
               "--port-file", port_file, "--run-id", run_id]
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore::UserWarning", **_devices_env(cfg, role))
        out.processes[role] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True)  # Ctrl-C reaches us only
        out.logs[role] = log_path
        _log.info("service.started", role=role, pid=out.processes[role].pid, log=log_path)
    return out


async def wait_ready(launched: Launched, run_dir: str, timeout_s: float) -> None:
    """Wait for every started service's port file; fail fast if one exits."""
    deadline = time.monotonic() + timeout_s
    pending = set(launched.processes)
    while pending:
        for role in list(pending):
            proc = launched.processes[role]
            port_file = os.path.join(run_dir, "logs", f"{role}.port")
            if proc.poll() is not None:
                raise RuntimeError(f"{role} service exited with code {proc.returncode} while starting; "
                                   f"last lines of {launched.logs[role]}:\n{_tail(launched.logs[role])}")
            if os.path.exists(port_file):
                with open(port_file) as f:
                    launched.endpoints[role] = f"127.0.0.1:{int(f.read().strip())}"
                pending.discard(role)
        if pending and time.monotonic() > deadline:
            raise TimeoutError(f"services {sorted(pending)} not serving after {timeout_s:g}s; "
                               f"see {os.path.join(run_dir, 'logs')}")
        await asyncio.sleep(0.2)


def stop(launched: Launched, grace_s: float = 10.0) -> None:
    """SIGTERM every started service, then SIGKILL what is left after the grace period."""
    for proc in launched.processes.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for role, proc in launched.processes.items():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _log.warning("service.kill", role=role, pid=proc.pid)
            proc.kill()
            proc.wait()
