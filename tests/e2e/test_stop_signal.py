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


@pytest.mark.xfail(strict=False, reason="known defect, open: in two full-suite runs on 2 loaded cores the controller "
                   "neither stopped nor reached controller/interrupt.py's 30 s deadline within 60 s of SIGTERM (its "
                   "Python handler did not run); passes alone (every run tried, 10+). Services no longer outlive it "
                   "(tests/services/test_parent_gone.py)")
def test_sigterm_mid_run_stops_the_services(tmp_path):
    overrides = [*TINY, f"trainer.default_local_dir={tmp_path}", "trainer.experiment_name=sigterm",
                 "trainer.total_training_steps=500"]  # still running when the signal comes
    proc = subprocess.Popen([sys.executable, "-m", "tandem.controller", "run", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; services stopped" in err, err[-4000:]  # the cleanup ran, not the deadline's exit
    assert not _alive(pids), f"service processes left running: {_alive(pids)}"
