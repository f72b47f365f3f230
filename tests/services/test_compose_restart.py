"""The compose launcher's restart on the controller's recovery path, against a real reward service
process started with its compose command (commands.service_argv: the run's config, a fixed port).

The test kills the service (kill -9) and then, standing in for compose's `restart: on-failure`,
starts it again with the same command a moment after it exited (later than the supervisor takes to
call it dead, as a model service's load is; a reward service that is back sooner is simply retried,
controller/reward_calls.py). A Score call made while it is down is
sent again by the Supervisor once the launcher finds the service serving at its compose address
again, and answers. No docker engine runs here: the container, its network name and compose's own
restart are what the test stands in for (the compose file's `restart` key: test_compose_file.py).
"""
import asyncio
import signal
import socket
import subprocess
import threading
import time

from tandem.config import load_config, to_yaml
from tandem.controller.clients import RewardClient
from tandem.controller.launchers import LaunchContext, commands
from tandem.controller.launchers.compose import ComposeLauncher
from tandem.controller.recovery import EXIT_GRACE_S, Supervisor
from tandem.controller.roles import Roles
from tandem.data.batch import DataProto

SCORED = DataProto(columns={"response_text": ["579", "12"], "ground_truth": ["579", "13"],
                            "data_source": ["tandem/arithmetic"] * 2})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_service_that_compose_restarts_is_found_again_and_the_call_resent(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(to_yaml(load_config(None, [])))
    port = free_port()
    argv = commands.service_argv("reward", str(config), host="127.0.0.1", port=port, run_id="compose")
    log = open(tmp_path / "reward.log", "ab")
    procs = [subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)]

    def restart_policy():  # compose's `restart: on-failure`: a container that exits with an error starts again
        if procs[0].wait() != 0:
            time.sleep(EXIT_GRACE_S)
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    launcher = ComposeLauncher(LaunchContext(str(config), str(tmp_path), "compose", startup_timeout_s=120),
                               address=lambda role: f"127.0.0.1:{port}")

    async def main():
        (endpoint,) = (await launcher.start(["reward"])).values()
        reward = RewardClient(endpoint, timeout_s=30)
        supervisor = Supervisor(launcher, Roles(actor=None, rollout=None, reward=reward), ["reward"], {},
                                max_restarts=1, startup_timeout_s=120)
        supervisor.watch()
        try:
            assert await reward.score(SCORED) == [1.0, 0.0]
            policy = threading.Thread(target=restart_policy)
            policy.start()
            procs[0].send_signal(signal.SIGKILL)
            t0 = time.monotonic()
            assert await reward.score(SCORED) == [1.0, 0.0]  # sent again to the service compose started
            waited = time.monotonic() - t0
            policy.join(timeout=10)
            assert len(procs) == 2 and procs[1].poll() is None  # answered by the process "compose" started
            assert supervisor.restarts == 1 and reward.endpoint == endpoint and waited > EXIT_GRACE_S
        finally:
            await supervisor.close()
            await reward.close()

    try:
        asyncio.run(main())
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        log.close()
