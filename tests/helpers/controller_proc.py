"""A real `tandem serve` process for the controller-service tests, and waiting on its records."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from tandem.controller.service.client import ControllerClient


class ControllerProcess:
    """`python -m tandem.controller serve` on free ports with its own state directory."""

    def __init__(self, state_dir, start_roles: str = "", log_name: str = "controller.log"):
        self.state_dir, self.start_roles, self.log_name = str(state_dir), start_roles, log_name
        self.proc: subprocess.Popen | None = None
        self.client: ControllerClient | None = None

    def start(self, timeout_s: float = 400) -> ControllerProcess:
        port_file = os.path.join(self.state_dir, "grpc.port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        os.makedirs(self.state_dir, exist_ok=True)
        cmd = [sys.executable, "-m", "tandem.controller", "serve", "--state-dir", self.state_dir, "--port", "0",
               "--port-file", port_file, "--http-port", "0"]
        if self.start_roles:
            cmd += ["--start", self.start_roles]
        with open(os.path.join(self.state_dir, self.log_name), "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env=dict(os.environ, PYTHONWARNINGS="ignore::UserWarning"))
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(port_file):
            assert self.proc.poll() is None, f"controller exited with {self.proc.returncode}; see {self.state_dir}"
            assert time.monotonic() < deadline, f"controller not serving after {timeout_s}s"
            time.sleep(0.3)
        self.client = ControllerClient(f"127.0.0.1:{int(open(port_file).read())}", timeout_s=60)
        return self

    @property
    def http(self) -> str:
        with open(os.path.join(self.state_dir, "controller.json")) as f:
            return json.load(f)["http"]

    def pool(self) -> dict:
        with open(os.path.join(self.state_dir, "services", "pool.json")) as f:
            return json.load(f)

    def pool_security(self):
        """How to call the services its pool started: with the pool's token."""
        from tandem.rpc.security import EndpointSecurity

        with open(os.path.join(self.state_dir, "services", "pool.token")) as f:
            return EndpointSecurity(token=f.read().strip())

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.client.close()

    def stop(self) -> None:
        """SIGTERM (the controller stops the services it started); every service pid must be gone."""
        pids = [e["pid"] for e in self.pool().values()] if os.path.exists(
            os.path.join(self.state_dir, "services", "pool.json")) else []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.client.close()
        for pid in pids:  # a test that failed half way must not leave services behind
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass

    def wait_for(self, run_id: str, pred, timeout_s: float = 600, what: str = "") -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            record, _ = self.client.get(run_id)
            if pred(record):
                return record
            assert time.monotonic() < deadline, f"{run_id}: {what or 'condition'} not met in {timeout_s}s: {record}"
            assert self.proc.poll() is None, f"controller died; see {self.state_dir}"
            time.sleep(0.3)

    def wait_ended(self, run_id: str, timeout_s: float = 600) -> dict:
        return self.wait_for(run_id, lambda r: r["state"] in ("succeeded", "failed", "cancelled"), timeout_s, "end")


def step_metrics(run_dir) -> dict[int, dict]:
    """{step: metrics without wall-clock figures} from a run's metrics.jsonl (later lines win:
    a resumed run logs the steps after its checkpoint again)."""
    out: dict[int, dict] = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "actor/pg_loss" in m:
                out[m["step"]] = {k: v for k, v in m.items() if not k.startswith(("timing_s/", "perf/"))}
    return out
