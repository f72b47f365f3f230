"""Where a service's start goes: its start-up phases, each timed once, in the order they ran.

A role's build times its own phases on the `StartupClock` it is given (`with clock.phase("build
policy"): ...`); tandem/serving/lifecycle.py adds the service's (the process's start, the rank
group, the config and seeding, what the role's build did outside its phases, the servicers),
logs them as one line (`service.startup`) and tells rank 0's in LifecycleService.Describe
(`startup`). bench/grpo_7b.py prints them after its run.

With CUDA each phase ends with a device synchronize: work a phase queued counts in it, not in
the next one (a start-up costs a few synchronizes, nothing else).
"""
from __future__ import annotations

import contextlib
import os
import time

import psutil

from tandem.parallel import device


class StartupClock:
    def __init__(self):
        self.phases: list[tuple[str, float]] = []  # (name, seconds), in order

    @contextlib.contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        yield
        device.synchronize()
        self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.phases.append((name, seconds))

    def extend(self, other: StartupClock) -> None:
        self.phases.extend(other.phases)

    @property
    def total(self) -> float:
        return sum(s for _, s in self.phases)

    def log_fields(self) -> dict:
        """One log line's fields: the total and {phase: seconds} (rounded to the millisecond)."""
        return {"total_s": round(self.total, 3), "phases_s": {name: round(s, 3) for name, s in self.phases}}


def since_process_start() -> float:
    """Seconds since this process was created: the interpreter's start, imports, argument parsing.
    On Linux from the kernel's clock-tick counts (psutil's create_time rests on a boot time rounded
    to the second, which can put the start up to a second off)."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()  # starts at the stat file's 3rd field
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(after_name[19]) / os.sysconf("SC_CLK_TCK"))  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return max(0.0, time.time() - psutil.Process(os.getpid()).create_time())
