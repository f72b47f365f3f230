"""`tandem run` stopped by SIGTERM (kill, docker stop, a scheduler) mid-run stops the services it
started: none is left running. (Should the run not stop within controller/interrupt.py's deadline,
it exits anyway and the services stop themselves: tests/unit/test_interrupt.py,
tests/services/test_parent_gone.py.)"""
import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest
from test_tandem_run import TINY, service_pids


def _alive(pids: set[int]) -> set[int]:
    return {p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}


def test_sigterm_mid_run_stops_the_services(tmp_path):
    overrides = [*TINY, f"trainer.default_local_dir={tmp_path}", "trainer.experiment_name=sigterm",
                 "trainer.total_training_steps=500"]  # still running when the signal comes
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:  # files: a pipe nobody reads would fill
        proc = subprocess.Popen([sys.executable, "-m", "tandem.controller", "run", *overrides], stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 240
        roles: dict[str, set[int]] = {}
        while time.monotonic() < deadline and proc.poll() is None and not roles:
            metrics = list(pathlib.Path(tmp_path).glob("sigterm-*/metrics.jsonl"))
            if metrics and metrics[0].stat().st_size > 0:  # RL has started: every service is up
                roles = service_pids(metrics[0].parent)
            time.sleep(0.5)
        pids = {p for role in roles.values() for p in role}
        # control: the run is still running, with its services
        assert proc.poll() is None and {"actor", "reward"} <= set(roles) and _alive(pids), roles
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=45)
        except subprocess.TimeoutExpired:  # where it hangs: every thread's stack (SIGUSR1, controller/interrupt.py)
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(2)
            pytest.fail(f"the run did not stop within 45 s of SIGTERM; its stacks then:\n{err_path.read_text()[-8000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = err_path.read_text()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; services stopped" in err, err[-4000:]  # the cleanup ran, not the deadline's exit
    assert not _alive(pids), f"service processes left running: {_alive(pids)}"
