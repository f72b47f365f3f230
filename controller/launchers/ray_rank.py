"""One rank of a service under the Ray launcher: a Ray actor that runs the service process on its node.

The Ray launcher (controller/launchers/ray.py) creates one `ServiceRank` actor per rank, placed in
its service's placement group; the actor starts the rank with the command from
controller/launchers/commands.py (as a child process, so a service runs exactly as under the
local launcher: its own torch.distributed, gRPC server and signal handling), and reports back
what the launcher needs through return values: its node, a free port for the rendezvous, and
rank 0's bound port once the service is SERVING. The rank dies with its actor, as it would with its
node: rank 0's server stops once its parent is gone (PARENT_PID_ENV, tandem/rpc/server.py) and a
rank > 0 gets SIGKILL (tandem/serving/parent.py; Ray runs a plain actor's methods on its main
thread, so that fires when the actor's process ends), so a restarted actor starts from nothing.

Deliberately not here: choosing nodes (the placement group does), talking gRPC to the service.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from tandem.controller.launchers.start_failure import how_it_ended, last_error
from tandem.rpc.server import PARENT_PID_ENV
from tandem.serving.parent import PARENT_ENV


class ServiceRank:
    """A service rank's process on the node Ray placed this actor on."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def node(self) -> dict:
        """{node_id, ip, hostname} of this actor's node."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname()}

    def free_port(self, host: str) -> int:
        """A port free on this node now (rank 0's TCPStore binds it right after)."""
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]

    def start(self, argv: list[str], env: dict[str, str], log_path: str, config_path: str,
              port_file: str | None, timeout_s: float) -> int | None:
        """Start the rank (argv[0] becomes this node's Python) -> its bound port (when `port_file`
        is given: rank 0 waits until the service is SERVING), else None."""
        if not os.path.exists(config_path):
            raise FileNotFoundError(f"{config_path} is not visible on node {socket.gethostname()}: the Ray launcher "
                                    f"needs the run directory (trainer.default_local_dir) on storage every node mounts")
        if port_file and os.path.exists(port_file):
            os.unlink(port_file)
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        mine = str(os.getpid())
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, *argv[1:]], stdout=log, stderr=subprocess.STDOUT,
                                         env=dict(os.environ, **env, **{PARENT_PID_ENV: mine, PARENT_ENV: mine}),
                                         start_new_session=True)
        if not port_file:
            return None
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(port_file):
            if self.proc.poll() is not None:  # its own last error first (start_failure.py), then its log
                raise RuntimeError(f"{last_error(log_path)}\n  (exited with code {self.proc.returncode} on node "
                                   f"{socket.gethostname()}; its log: {log_path})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not serving after {timeout_s:g}s; see {log_path}")
            time.sleep(0.2)
        with open(port_file) as f:
            return int(f.read().strip())

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def state(self) -> str:
        """'running', how the rank's process ended, or 'not started' (an actor Ray restarted)."""
        if self.proc is None:
            return "not started"
        code = self.proc.poll()
        return "running" if code is None else how_it_ended(code)

    def kill(self) -> None:
        """SIGKILL what is left of the rank (its process group: it may hang, or be stopped)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # already gone
        self.proc.wait()

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the rank, SIGKILL it after `grace_s` -> its exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.exit_code()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
