"""torch.compile's on-disk caches in a chosen directory (services.compile_cache_dir).

Inductor keeps its compiled graphs (FX graph and AOT-autograd caches) under
TORCHINDUCTOR_CACHE_DIR and triton its kernels under TRITON_CACHE_DIR, both in /tmp by default:
a recreated container compiles everything again (tens of seconds per model at the first step).
Their entries are keyed by the graph, torch / triton versions and the device, so one directory can
serve every run and every service. torch reads both variables when it looks a cache up, so
setting them when a run is configured, before its workers compile anything, is enough.

Deliberately not here: which directory (the config; deploy/ mounts a named volume in compose).
"""
from __future__ import annotations

import os

VARIABLES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
_BEFORE = {name: os.environ.get(name) for name in VARIABLES}  # the process's own (torch's default when unset)


def use_compile_cache(directory: str | None) -> None:
    """Point torch's compile caches at `directory`'s subfolders (created); None: back to what the
    process started with (a long-lived service holding a run without the key after one with it)."""
    for name, sub in VARIABLES.items():
        if directory is not None:
            path = os.path.join(directory, sub)
            os.makedirs(path, exist_ok=True)
            os.environ[name] = path
        elif _BEFORE[name] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = _BEFORE[name]
