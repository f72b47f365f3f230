"""verl's per-step memory metrics of a model worker's process.

`perf/max_memory_allocated_gb` and `perf/max_memory_reserved_gb`: the device's peaks since the
previous call (each call starts a new window, so a step's figure covers that step's work in this
process; 0 on CPU); `perf/cpu_memory_used_gb`: this process's resident host memory now (verl
logs the whole machine's used memory; a process's own figure stays meaningful when roles share a
host). The actor logs them under verl's names, the critic under `perf/critic/...`
(tandem/algos/metrics.py).
"""
from __future__ import annotations

import psutil

from tandem.algos import metrics as M
from tandem.parallel import device

GIB = 1024 ** 3
NAMES = {  # role -> (allocated, reserved, cpu) metric names
    "actor": (M.PERF_MAX_MEMORY_ALLOCATED_GB, M.PERF_MAX_MEMORY_RESERVED_GB, M.PERF_CPU_MEMORY_USED_GB),
    "critic": (M.CRITIC_PERF_MAX_MEMORY_ALLOCATED_GB, M.CRITIC_PERF_MAX_MEMORY_RESERVED_GB,
               M.CRITIC_PERF_CPU_MEMORY_USED_GB),
}


def memory_metrics(role: str) -> dict[str, float]:
    """This process's memory figures under `role`'s names; starts the next peak window."""
    allocated, reserved = device.memory_peaks()
    device.reset_memory_peaks()
    rss = psutil.Process().memory_info().rss
    names = NAMES[role]
    return {names[0]: allocated / GIB, names[1]: reserved / GIB, names[2]: rss / GIB}
