"""A long-lived service's hold on one run: Configure builds it on every rank, Release drops it.

`RankHost` is every rank's "lifecycle" target in the rank group: it loads the run's config,
seeds, builds the role's workers (`Role.build`) and registers them as rank-group targets;
release drops them, collects garbage and empties the device cache. `RunHost` (rank 0) owns
the rank group: on Configure it (re)starts the ranks when the run needs another world size or
TP x PP x EP layout (rank 0 stops its children, re-initialises torch.distributed and
megatron's parallel_state, and starts new children), broadcasts the configure command,
and builds the servicers the gRPC proxies forward to (tandem/serving/slot.py).

Everything here runs on the service's WorkerThread (model work is serialised with the
RPCs), except `interrupt` and `describe`, which answer from the event loop at once.

Deliberately not here: the gRPC edge (lifecycle_servicer.py), process arguments (process.py).
"""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch

from tandem.config import load_config
from tandem.generation import interrupt
from tandem.logging import configure_logging, get_logger
from tandem.parallel import device
from tandem.parallel.layout import ParallelConfig, init_distributed
from tandem.rpc.errors import FailedPrecondition
from tandem.rpc.protocol import PROTOCOL
from tandem.serving.allowed_dirs import check_allowed
from tandem.serving.call_observer import CallObserver, profile_section
from tandem.serving.compile_cache import use_compile_cache
from tandem.serving.parent import PARENT_ENV
from tandem.serving.role import Built, Role
from tandem.serving.startup import StartupClock

LIFECYCLE = "lifecycle"  # the rank-group target every rank has
RENDEZVOUS_TIMEOUT = timedelta(minutes=10)  # how long ranks wait for each other to come up
_log = get_logger("tandem.serving.lifecycle")


class RankHost:
    """One rank's share of the held run."""

    def __init__(self, role: Role, rank: int):
        self.role, self.rank = role, rank
        self.group = None  # the RankGroup whose targets this host fills (None: no ranks)
        self.built: Built | None = None
        self.startup = StartupClock()  # the last configure's phases

    def configure(self, run_id: str, config_yaml: str) -> int:
        """Build this rank's workers for the run -> this process's pid. Its start-up phases go to
        `self.startup` (and, on ranks > 0, to the log; rank 0's RunHost logs them with its own)."""
        t0 = time.perf_counter()
        cfg = load_config(text=config_yaml)
        configure_logging(role=self.role.name, rank=self.rank, run_id=run_id)
        section = self.role.section(cfg)
        torch.set_num_threads(max(1, section.torch_threads))
        use_compile_cache(cfg.services.compile_cache_dir)  # before the workers compile anything
        if self.role.ranked(cfg):  # the same weights as a service started for this run alone
            device.manual_seed(self.role.seed(cfg))
            # this run's cap on the rank's GPU share (services sharing a GPU); none: the whole GPU
            device.set_memory_fraction(section.gpu_memory_fraction or 1.0)
        clock = StartupClock()
        clock.add("config, seed", time.perf_counter() - t0)
        t0 = time.perf_counter()
        self.built = self.role.build(cfg)
        device.synchronize()
        role_phases = self.built.startup
        clock.extend(role_phases)
        # the build's untimed rest (all of it for a role that times no phases)
        clock.add("build, other" if role_phases.phases else "build", time.perf_counter() - t0 - role_phases.total)
        if self.group is not None:
            self.group.targets.update(self.built.targets)
            self.group.observer = CallObserver(self.role.name, self.rank, profile_section(cfg, self.role.name))
        self.startup = clock
        if self.rank:
            _log.info("service.startup", **clock.log_fields())
        _log.info("run.configured", run=run_id, pid=os.getpid())
        return os.getpid()

    def release(self) -> int:
        """Drop this rank's workers (model, optimizer, KV cache) and free their memory -> pid."""
        if self.built is not None:
            closers = self.built.closers
            while closers:  # popped: no loop variable keeps a closer's object alive past the collect below
                closers.pop(0)()
            if self.group is not None:
                for name in self.built.targets:
                    self.group.targets.pop(name, None)
        self.built = None
        self.close_observer()
        torch.compiler.reset()  # compiled graphs may hold the old modules (GPUs: torch.compile'd layers)
        gc.collect()
        device.empty_cache()
        configure_logging(role=self.role.name, rank=self.rank, run_id=None)
        return os.getpid()


    def close_observer(self) -> None:
        """Write the open trace (the run is released or the process stops)."""
        if self.group is not None and self.group.observer is not None:
            self.group.observer.close()
            self.group.observer = None


class RunHost:
    """Rank 0: the held run, the rank group and its child processes."""

    def __init__(self, role: Role, allowed_dirs: list[str] | None = None):
        self.role = role
        self.allowed_dirs = list(allowed_dirs or [])  # where a run's config may name code to import (--allow-dir)
        self.rank_host = RankHost(role, rank=0)
        self.group = None
        self.children: list[subprocess.Popen] = []
        self.stopping = threading.Event()  # set before this process stops its children on purpose
        self.store = None  # the TCPStore rank 0 opened for its children (kept open while they live)
        self.external = False  # the ranks were started by someone else: their layout cannot change
        self.layout: tuple[int, ParallelConfig] | None = None
        self.run_id: str | None = None
        self.pending: str | None = None  # a Configure on its way (set on the event loop)
        self.servicers: dict[str, Any] = {}
        self.ranked_run = False  # the held run is served by the rank group (else by rank 0 alone)
        self.check_caller = True  # refuse calls tagged with another run's x-run-id (slot.py)
        self.process_start_s: float | None = None  # a run taken at start: the process's start before it
        self.startup: StartupClock | None = None  # the held run's start-up phases (rank 0)

    @property
    def holder(self) -> str | None:
        return self.run_id or self.pending

    @property
    def pids(self) -> list[int]:
        return [os.getpid()] + [c.pid for c in self.children]

    # ---- on the worker thread ----------------------------------------------------------

    def configure(self, run_id: str, config_yaml: str, thread) -> tuple[list[int], bool]:
        """Take the run -> (its rank pids, whether the ranks were restarted for its layout)."""
        cfg = load_config(text=config_yaml)  # ConfigError: the servicer answers INVALID_ARGUMENT
        if self.role.imports_code:  # before anything is built: a file outside is never imported
            check_allowed(cfg, self.allowed_dirs)
        restarted = False
        interrupt.clear()
        clock = StartupClock()
        if self.process_start_s is not None:
            clock.add("process start (interpreter, imports)", self.process_start_s)
            self.process_start_s = None
        self.ranked_run = self.role.ranked(cfg)
        if self.ranked_run:
            world, parallel = self.role.layout(cfg)
            self.role.check_layout(cfg)
            if self.layout != (world, parallel):
                if self.external:
                    raise FailedPrecondition(
                        f"this {self.role.name} service's ranks were started separately as world size "
                        f"{self.layout[0]}, {self.layout[1]}; the run needs {world}, {parallel}")
                restarted = self.layout is not None
                with clock.phase("rank group"):
                    self.start_group(world, parallel)
            t0 = time.perf_counter()
            try:
                pids = self.group.run_ranks(LIFECYCLE, "configure", [(run_id, config_yaml)] * self.group.world)
            except BaseException:
                self._release_ranks()
                raise
            clock.extend(self.rank_host.startup)
            if self.group.world > 1:  # the other ranks build at the same time; the slowest one's rest
                clock.add("other ranks", max(0.0, time.perf_counter() - t0 - self.rank_host.startup.total))
        else:
            pids = [self.rank_host.configure(run_id, config_yaml)]
            clock.extend(self.rank_host.startup)
        with clock.phase("servicers"):
            self.servicers = self.role.servicers(cfg, self.rank_host.built, self.group, thread)
        self.run_id, self.startup = run_id, clock
        _log.info("service.startup", **clock.log_fields())
        return pids, restarted

    def release(self) -> str | None:
        """Give the run back -> its id (None when nothing was held)."""
        held, self.run_id, self.servicers, self.startup = self.run_id, None, {}, None
        self._release_ranks()
        interrupt.clear()
        _log.info("run.released", run=held)
        return held

    def _release_ranks(self) -> None:
        if self.ranked_run and self.group is not None:
            self.group.run_ranks(LIFECYCLE, "release", [()] * self.group.world)
        else:
            self.rank_host.release()

    def start_group(self, world: int, parallel: ParallelConfig) -> None:
        """(Re)start the rank group: `world` processes (this one and world - 1 children) in
        torch.distributed, megatron's parallel_state laid out as `parallel`."""

        self.stop_group()
        if world > 1:  # a TCPStore on a free port of this host; the children connect to it
            self.store = torch.distributed.TCPStore("127.0.0.1", 0, world, is_master=True,
                                                    timeout=RENDEZVOUS_TIMEOUT, wait_for_workers=False)
            self.children = [_start_rank(self.role.name, rank, world, parallel, self.store.port)
                             for rank in range(1, world)]
            self.stopping = threading.Event()
            threading.Thread(target=_exit_when_a_rank_dies, args=(self.children, self.stopping), daemon=True,
                             name="rank-watch").start()
        self.attach_group(world, parallel, self.store)
        self.external = False
        _log.info("ranks.started", world_size=world, tp=parallel.tp, pp=parallel.pp, ep=parallel.ep, cp=parallel.cp,
                  pids=self.pids)

    def attach_group(self, world: int, parallel: ParallelConfig, store) -> None:
        """Join the ranks as rank 0 through `store` (ranks started separately: their layout stays)."""
        from tandem.serving.rank_group import RankGroup

        init_distributed(parallel, rank=0, world_size=world, store=store, seed=0)
        self.group = RankGroup({LIFECYCLE: self.rank_host})
        self.rank_host.group = self.group
        self.layout, self.external = (world, parallel), True

    def stop_group(self) -> None:
        """Stop the children and tear down torch.distributed and parallel_state (no-op without ranks)."""
        if self.group is None:
            return
        from megatron.core import parallel_state as ps

        self.stopping.set()  # the children exit on purpose now
        self.group.stop()
        for child in self.children:
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        ps.destroy_model_parallel()
        torch.distributed.destroy_process_group()
        self.group = self.rank_host.group = self.store = None
        self.children, self.layout = [], None

    # ---- on the event loop -------------------------------------------------------------

    def interrupt(self) -> None:
        """The held run is being cancelled: cut its generations (tandem/generation/interrupt.py)."""
        interrupt.request()

    def describe(self) -> dict:
        world, parallel = self.layout or (1, ParallelConfig())
        return {"role": self.role.name, "run_id": self.run_id or "", "world_size": world, "pids": self.pids,
                "tensor_parallel": parallel.tp, "pipeline_parallel": parallel.pp,
                "expert_parallel": parallel.ep, "tensor_bytes": live_tensor_bytes(),
                "interrupted": interrupt.requested(), "protocol": PROTOCOL,
                "startup": [{"name": n, "seconds": t} for n, t in (self.startup.phases if self.startup else [])]}


def live_tensor_bytes() -> int:
    """Bytes of the distinct storages of every live torch tensor in this process: what a held
    run keeps (models, optimizer state, KV cache), close to 0 once it is released."""
    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor):  # type(): isinstance would ask lazy modules for __class__
            continue
        try:
            storage = obj.untyped_storage()
            ptr = storage.data_ptr()
        except (RuntimeError, NotImplementedError):  # meta, sparse and other storage-less tensors
            continue
        if ptr and ptr not in seen:
            seen.add(ptr)
            total += storage.nbytes()
    return total


def _exit_when_a_rank_dies(children: list[subprocess.Popen], stopping: threading.Event) -> None:
    """Rank 0: exit at once when a child rank exits unasked (killed, OOM, crashed), instead of
    hanging in the next collective; the other ranks follow through PR_SET_PDEATHSIG."""
    from tandem.serving.rank_group import exit_rank_lost

    while not stopping.is_set():
        for rank, proc in enumerate(children, start=1):
            if proc.poll() is not None and not stopping.is_set():
                exit_rank_lost(rank=rank, pid=proc.pid, returncode=proc.returncode)
        time.sleep(0.1)


def _start_rank(role: str, rank: int, world: int, parallel: ParallelConfig, master_port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", f"tandem.services.{role}", "--rank", str(rank), "--world-size", str(world),
           "--layout", f"{parallel.tp},{parallel.pp},{parallel.ep},{parallel.cp}"]
    env = dict(os.environ, LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port),
               **{PARENT_ENV: str(os.getpid())})
    # no preexec_fn: Python code between fork and exec in a process with gRPC's threads crashed
    # the child (SIGSEGV) now and then; the child asks to die with its parent itself (die_with_parent)
    return subprocess.Popen(cmd, env=env)
