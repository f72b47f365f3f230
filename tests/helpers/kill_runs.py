"""`tandem run` as a child process that the test kills a service rank of mid-run (kill -9; SIGSTOP
for a rank that hangs alive; or its Ray actor), and the metrics it logged. Shared by the
crash-recovery tests (tests/e2e/test_recovery.py, test_ray_launcher.py)."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

COUNTED = {"perf/total_num_tokens"}  # the one perf/ figure that is not wall-clock, rate or memory


def compared(key: str) -> bool:
    """Not a wall-clock time, rate or memory figure (those differ between any two runs), nor the
    count of restarts (an interrupted run's own)."""
    return (not key.startswith("timing_s/") and (not key.startswith("perf/") or key in COUNTED)
            and key != "trainer/restarts")


def metric_lines(run_dir) -> list[dict]:
    """Every line of metrics.jsonl; exactly one per step (a recovered run's lines of redone steps
    replaced the old ones; the final validation and restarts are in their step's line)."""
    lines = [json.loads(x) for x in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [m["step"] for m in lines]
    assert len(steps) == len(set(steps)), f"a step logged twice: {steps}"
    return lines


def step_metrics(run_dir) -> dict[int, dict]:
    """{step: that step's line without wall-clock or memory keys} of the RL step lines of metrics.jsonl."""
    return {m["step"]: {k: v for k, v in m.items() if compared(k)}
            for m in metric_lines(run_dir) if "actor/pg_loss" in m}


def rank_pids(run_dir, role: str) -> dict[int, int]:
    """{rank: pid} of the live processes of `role`'s service, from its logs' `service.process` lines
    (the latest start of each rank; under Ray, ranks > 0 log to <role>.rank<i>.log)."""
    pids: dict[int, int] = {}
    for log in sorted(glob.glob(os.path.join(run_dir, "logs", f"{role}.log")) +
                      glob.glob(os.path.join(run_dir, "logs", f"{role}.rank*.log"))):
        for line in open(log, errors="replace"):
            if '"service.process"' in line:
                event = json.loads(line)
                pids[event["rank"]] = event["pid"]
    return pids


@dataclass(frozen=True)
class Kill:
    """What run_and_kill sends: `signal` to rank `rank` of `role`'s service (or to its parent process)
    once a step >= `after_step` is logged."""

    role: str
    rank: int
    after_step: int
    signal: int = signal.SIGKILL  # SIGSTOP: the rank hangs, alive
    target: str = "rank"  # or "parent": the process that started the rank (a Ray actor)


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])  # the field after the state: the parent's pid


def logged_steps(run_dir) -> list[int]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(x)["step"] for x in open(path) if x.strip() and "actor/pg_loss" in x]


def run_and_kill(overrides: list[str], kills: list[tuple], timeout_s: float = 400,
                 env: dict | None = None) -> tuple[int, str, str, str, list[int]]:
    """Start `tandem run` and, for each `Kill(*k)` of `kills` in turn (role, rank, after_step[, signal,
    target]), signal rank `rank` of `role`'s service as soon as a step >= after_step is logged (so the
    kills of one run come after each other's recovery when their steps increase); wait for the run to
    end -> (exit code, stdout, stderr, run dir, the pids signalled)."""
    proc = subprocess.Popen([sys.executable, "-m", "tandem.controller", "run", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + timeout_s
    run_dir, killed, out = None, [], ""
    try:
        while run_dir is None:  # the first stdout line names the run directory
            line = proc.stdout.readline()
            out += line
            found = re.search(r"tandem: run directory (\S+)", line)
            run_dir = found.group(1) if found else None
            assert line or proc.poll() is None, f"run ended before it began:\n{out}\n{proc.stderr.read()[-3000:]}"
        for kill in (Kill(*k) for k in kills):
            while not any(s >= kill.after_step for s in logged_steps(run_dir)):
                assert time.monotonic() < deadline and proc.poll() is None, f"run ended before killing {kill.role}"
                time.sleep(0.02)
            pid = rank_pids(run_dir, kill.role)[kill.rank]
            killed.append(parent_of(pid) if kill.target == "parent" else pid)
            os.kill(killed[-1], kill.signal)
        rest, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert not (left := processes_of(proc.pid)), f"processes of the run left behind: {left}"
    return proc.returncode, out + rest, err, run_dir, killed


def processes_of(controller_pid: int, wait_s: float = 10.0) -> list[str]:
    """The processes still alive `wait_s` after the run ended that the run started (they carry its
    pid in TANDEM_PARENT_PID: services, their ranks, the helpers those spawned)."""
    mark = f"TANDEM_PARENT_PID={controller_pid}".encode()
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        left.append(f"{pid}: {open(f'/proc/{pid}/cmdline', 'rb').read()[:120]!r}")
            except OSError:
                continue  # gone meanwhile, or not ours to read
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
