"""A rank process that ends with the process that started it: its rank 0, or its Ray launcher actor.

The starter puts its pid in PARENT_ENV; the rank calls `die_with_parent` before anything else and
gets SIGKILL from the kernel when the starting thread ends (PR_SET_PDEATHSIG), so no rank outlives
the one that can stop it. Standard library only: a Ray launcher actor imports it without torch.
"""
from __future__ import annotations

import os
import signal

PARENT_ENV = "TANDEM_RANK0_PID"  # set for a rank by rank 0 or by its Ray actor: the rank dies with it


def die_with_parent() -> None:
    """Get SIGKILL when the process in PARENT_ENV ends (PR_SET_PDEATHSIG), and exit at once if it
    already has; nothing without PARENT_ENV."""
    import ctypes

    parent = int(os.environ.get(PARENT_ENV, "0"))
    if not parent:
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request took effect
        os._exit(1)
