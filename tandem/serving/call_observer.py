"""What every rank notes around each rank-group call: the RL step it belongs to, a torch.profiler
trace of the chosen steps and ranks (verl's `profile` keys), and the seconds it spent compiling.

Traces: `<save_path>/<role>_rank<r>_step<s>.json` (Chrome trace JSON; chrome://tracing or
https://ui.perfetto.dev, or `python bench/trace_gaps.py FILE`), one per traced RL step, holding
every call of that step on that rank (each call a `<target>.<method>` range). The step is the
caller's `x-step` (controller/roles.py `set_step`); a step's trace is written when the first call
of another step arrives, or when the run is released or the service stops. Calls that carry no
step go into the trace of the step under way (none before the first RL step); the last step's
trace also holds what the run does after it with the same tag (final validation, checkpoint).

Compile time: after a call in which this process spent time in torch.compile (dynamo + inductor,
`torch._dynamo.utils.calculate_time_spent`) or capturing CUDA graphs
(tandem/generation/graphs.py), one log line `compile.spent` with both (bench/e2e_step.py reads them)
and torch's split of the compile time (frame_s, backend_s, inductor_s, code_gen_s, async_compile_wait_s)
and its caches' answers (fx_cache_hit / _miss / _bypass, aot_cache_hit / _miss / _bypass; only those that moved),
and inductor's compile worker pool (compile_threads, compile_pool_up).

Garbage collection: after a call in which Python's cyclic collector ran for over a millisecond or
made a full (generation 2) collection, one line `gc.paused` with its seconds and counts
(tandem/serving/gc_pauses.py): the collector stops every thread, the GPU's feeder included.

Deliberately not here: which section applies to which service (tandem/config/checks/profile.py),
the rank-group protocol (rank_group.py).
"""
from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext

import torch

from tandem.logging import get_logger
from tandem.serving import gc_pauses

_log = get_logger("tandem.serving.call_observer")


# torch's own compile phases (calculate_time_spent's keys), logged per call beside the total: what a
# first step pays with a warm on-disk cache (dynamo's tracing is never cached) is then readable
PHASES = {"frame_s": "entire_frame_compile", "backend_s": "backend_compile", "inductor_s": "inductor_compile",
          "code_gen_s": "code_gen", "async_compile_wait_s": "async_compile.wait"}
# and how torch's on-disk caches answered (hits, misses, bypasses: a graph the cache cannot hold)
CACHE_COUNTS = {"fx_cache_hit": ("inductor", "fxgraph_cache_hit"), "fx_cache_miss": ("inductor", "fxgraph_cache_miss"),
                "fx_cache_bypass": ("inductor", "fxgraph_cache_bypass"),
                "aot_cache_hit": ("aot_autograd", "autograd_cache_hit"),
                "aot_cache_miss": ("aot_autograd", "autograd_cache_miss"),
                "aot_cache_bypass": ("aot_autograd", "autograd_cache_bypass")}


def compile_times() -> dict[str, float]:
    """Seconds this process spent in torch.compile so far: 'total' (dynamo frames, backward included)
    and the PHASES torch reports (absent ones 0), and the CACHE_COUNTS so far."""
    try:
        from torch._dynamo.utils import calculate_time_spent, counters
    except ImportError:  # pragma: no cover - torch without dynamo
        return {}
    spent = calculate_time_spent()
    return {"total": float(spent.get("total_wall_time", 0.0)),
            **{k: float(spent.get(key, 0.0)) for k, key in PHASES.items()},
            **{k: counters[group][key] for k, (group, key) in CACHE_COUNTS.items()}}


def compile_pool() -> dict:
    """Inductor's kernel-compile worker pool as it stands (without starting it): its thread count and
    whether it is up. Kernels compiled while it is not are compiled one at a time in this process."""
    try:
        from torch._inductor import async_compile, config

        ready = async_compile.AsyncCompile._ready_future
        return {"compile_threads": config.compile_threads, "compile_pool_up": bool(ready is not None and ready.done())}
    except (ImportError, AttributeError):  # pragma: no cover - another torch's internals
        return {}


def capture_seconds() -> float:
    from tandem.generation.graphs import CAPTURE_SECONDS

    return CAPTURE_SECONDS[0]


class CallObserver:
    """One rank's observer (`profile`: the service's ProfileConfig, None: no traces)."""

    def __init__(self, role: str, rank: int, profile=None):
        self.role, self.rank = role, rank
        on = profile is not None and profile.use_profile
        self.ranks = set([0] if on and profile.profile_ranks is None else (profile.profile_ranks if on else []))
        self.profile = profile if on and rank in self.ranks else None
        self.step: int | None = None
        self.prof = None
        gc_pauses.install()

    def wants(self, step: int | None) -> bool:
        p = self.profile
        return p is not None and step is not None and p.step_start <= step < p.step_end

    @contextmanager
    def call(self, step: int | None, name: str):
        self._at_step(step)
        c0, g0, gc0 = compile_times(), capture_seconds(), gc_pauses.totals()
        with torch.profiler.record_function(name) if self.prof is not None else nullcontext():
            yield
        paused = gc_pauses.since(gc0)
        if paused["full"] or paused["gc_s"] > 1e-3:
            _log.info("gc.paused", method=name, rl_step=step, gc_s=round(paused["gc_s"], 4),
                      collections=paused["collections"], full=paused["full"], full_s=round(paused["full_s"], 4))
        c1, dg = compile_times(), capture_seconds() - g0
        dc = c1.get("total", 0.0) - c0.get("total", 0.0)
        if dc > 1e-3 or dg > 1e-3:  # phases: torch's split of compile_s (tracing = frame_s - backend_s)
            phases = {k: round(c1[k] - c0.get(k, 0.0), 3) for k in PHASES if k in c1}
            moved = {k: c1.get(k, 0) - c0.get(k, 0) for k in CACHE_COUNTS}
            phases.update({k: n for k, n in moved.items() if n}, **compile_pool())
            _log.info("compile.spent", method=name, rl_step=step, compile_s=round(dc, 3), graph_capture_s=round(dg, 3),
                      **phases)

    def _at_step(self, step: int | None) -> None:
        # a call without a step (the weight plane's export after an update) belongs to the step under
        # way: switching to "no step" would write its trace early and start it again after
        if step is None or step == self.step:
            return
        self.close()
        self.step = step
        if self.wants(step):
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=activities)
            self.prof.start()

    def close(self) -> None:
        """Write the open trace, if any."""
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        prof.stop()
        os.makedirs(self.profile.save_path, exist_ok=True)
        path = os.path.join(self.profile.save_path, f"{self.role}_rank{self.rank}_step{self.step}.json")
        if os.path.exists(path):  # another process of the role (a second rollout replica)
            path = path[:-len(".json")] + f"_pid{os.getpid()}.json"
        prof.export_chrome_trace(path)
        _log.info("profile.written", path=path, rl_step=self.step)


def profile_section(cfg, role: str):
    """The ProfileConfig a service of `role` reads (None: the role has none, e.g. the reward)."""
    from tandem.config.checks.profile import SECTIONS, section_of

    return section_of(cfg, SECTIONS[role]) if role in SECTIONS else None


def step_of_call() -> int | None:
    """The RL step the current call carries (x-step, bound by tandem/rpc/interceptors.py)."""
    import structlog

    value = structlog.contextvars.get_contextvars().get("step")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
