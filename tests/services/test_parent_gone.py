"""A service started by `tandem run` stops itself when the controller is killed outright (SIGKILL,
the OOM killer): it is told its parent (TANDEM_PARENT_PID) and stops gracefully once that process
is gone, instead of running on with nobody to stop it. The reward service is started for real
(python -m tandem.services.reward): it needs no model."""
import os
import signal
import subprocess
import sys
import time

import psutil

# stands in for the controller: starts the service in its own session (as the local launcher
# does), prints its pid, then waits to be killed
PARENT = """
import os, subprocess, sys
log = open(sys.argv[2], "wb")
child = subprocess.Popen([sys.executable, "-m", "tandem.services.reward", "--port-file", sys.argv[1]],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                         env=dict(os.environ, TANDEM_PARENT_PID=str(os.getpid())))
print(child.pid, flush=True)
child.wait()
"""


def _running(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def test_the_service_stops_when_its_parent_is_killed(tmp_path):
    port_file, log = tmp_path / "reward.port", tmp_path / "reward.log"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(port_file), str(log)], stdout=subprocess.PIPE,
                              text=True)
    child = int(parent.stdout.readline())
    try:
        assert _wait(port_file.exists, 120), log.read_text()
        time.sleep(2.5)  # control: with its parent alive it keeps serving (the watch polls every second)
        assert _running(child) and port_file.exists()
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _wait(lambda: not _running(child), 30), f"the service outlived its parent:\n{log.read_text()}"
        assert not port_file.exists()  # a graceful stop: the port file removed
        assert "server.parent_gone" in log.read_text()
    finally:
        if _running(child):
            os.kill(child, signal.SIGKILL)


def test_a_parent_pid_that_is_not_a_number_is_refused(tmp_path):
    port_file = tmp_path / "reward.port"
    proc = subprocess.run([sys.executable, "-m", "tandem.services.reward", "--port-file", str(port_file)],
                          env=dict(os.environ, TANDEM_PARENT_PID="controller"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and not port_file.exists()
    assert "TANDEM_PARENT_PID='controller' is not a process id" in proc.stdout + proc.stderr
