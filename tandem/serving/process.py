"""What every service's `__main__` does before it serves: arguments, logging, threads, ranks.

A service is started as `python -m services.<role> --config RUN.yaml [--port-file F]`.
The config is the run's resolved YAML (tandem.config); the role takes its own section.

A service of several ranks (`services.<role>.world_size` > 1) is started the same way:
that process is rank 0 (the gRPC front door); it validates the parallel layout, starts
ranks 1..N-1 as child processes of the same module (`--rank i`), and all of them meet
in torch.distributed. Children die with rank 0 (PR_SET_PDEATHSIG), and rank 0 dies with
any of them: a service that lost a rank cannot finish a collective, so it exits
(rank_group.RANK_LOST_EXIT) and its launcher restarts it whole (controller/recovery.py).
"""
from __future__ import annotations

import argparse
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import torch

from tandem.config import TandemConfig, load_config
from tandem.logging import configure_logging, get_logger

_stopping = threading.Event()  # set by rank 0 before it stops its other ranks on purpose


@dataclass
class ServiceArgs:
    cfg: TandemConfig
    host: str
    port: int
    port_file: str | None
    run_id: str | None
    config_path: str | None = None
    overrides: list = field(default_factory=list)
    rank: int = 0
    rendezvous: str | None = None


def parse_args(role: str, argv=None) -> ServiceArgs:
    p = argparse.ArgumentParser(prog=f"python -m services.{role}",
                                description=f"Tandem {role} service (gRPC)")
    p.add_argument("--config", help="run config YAML (defaults when omitted)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (see --port-file)")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--run-id", default=os.environ.get("TANDEM_RUN_ID"))
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)  # set by rank 0 for its children
    p.add_argument("--rendezvous", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="dotted config overrides, key=value")
    a = p.parse_args(argv)
    cfg = load_config(a.config, a.overrides)
    return ServiceArgs(cfg, a.host, a.port, a.port_file, a.run_id, a.config, list(a.overrides),
                       a.rank, a.rendezvous)


def init_service(role: str, args: ServiceArgs, torch_threads: int, seed: int, *,
                 parallel=None, world_size: int = 1, shape=None):
    """Logging, torch threads, and (for model roles) this rank's torch.distributed and
    megatron parallel_state. Rank 0 checks the layout against `shape` (heads, query
    groups, experts) and starts the other ranks first."""
    configure_logging(role=role, rank=args.rank, run_id=args.run_id)
    log = get_logger(f"services.{role}")
    # one line per rank process: how tests and operators count a service's processes
    log.info("service.process", pid=os.getpid(), world_size=world_size)
    torch.set_num_threads(max(1, torch_threads))
    if role == "reward":
        return log
    from tandem.parallel.layout import ParallelConfig, init_distributed

    parallel = parallel or ParallelConfig()
    if shape is not None:
        parallel.validate(world_size, shape.num_attention_heads, shape.num_key_value_heads,
                          shape.moe.num_experts if shape.moe else 0)
    rendezvous = args.rendezvous
    if args.rank == 0:
        rendezvous = _rendezvous_file(role)
        _start_other_ranks(role, args, world_size, rendezvous)
    init_distributed(parallel, rank=args.rank, world_size=world_size,
                     init_method=f"file://{rendezvous}", seed=seed)
    return log


def _start_other_ranks(role: str, args: ServiceArgs, world_size: int, rendezvous: str) -> None:
    base = [sys.executable, "-m", f"services.{role}", "--rendezvous", rendezvous]
    if args.config_path:
        base += ["--config", args.config_path]
    if args.run_id:
        base += ["--run-id", args.run_id]
    ranks = []
    for rank in range(1, world_size):
        env = dict(os.environ, LOCAL_RANK=str(rank))
        ranks.append((rank, subprocess.Popen(base + ["--rank", str(rank), *args.overrides], env=env,
                                             preexec_fn=_die_with_parent)))
    if ranks:
        threading.Thread(target=_exit_when_a_rank_dies, args=(role, ranks), daemon=True,
                         name="rank-watch").start()


def _exit_when_a_rank_dies(role: str, ranks: list[tuple[int, subprocess.Popen]]) -> None:
    """Rank 0: exit at once when another rank exits unasked (killed, OOM, crashed), instead of
    hanging in the next collective; the other ranks follow through PR_SET_PDEATHSIG."""
    while not _stopping.is_set():
        for rank, proc in ranks:
            if proc.poll() is not None and not _stopping.is_set():
                from tandem.serving.rank_group import exit_rank_lost

                exit_rank_lost(rank=rank, pid=proc.pid, returncode=proc.returncode)
        time.sleep(0.1)


def _die_with_parent() -> None:
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _rendezvous_file(role: str) -> str:
    import tempfile

    fd, path = tempfile.mkstemp(prefix=f"tandem-{role}-", suffix=".rdzv")
    os.close(fd)
    os.unlink(path)  # torch's FileStore creates it; a fresh name per service
    return path


def load_tokenizer(cfg: TandemConfig):
    from transformers import AutoTokenizer

    path = cfg.actor_rollout_ref.model.tokenizer_path
    if not path:
        raise ValueError("actor_rollout_ref.model.tokenizer_path must be set (the controller sets it)")
    return AutoTokenizer.from_pretrained(path)


def serve_group(role: str, args: ServiceArgs, group, servicers) -> None:
    """Run a service's rank group: ranks > 0 follow rank 0's commands; rank 0 serves the
    gRPC `servicers(thread)` (a list of (service name, servicer)) with model work on one
    WorkerThread, until SIGTERM, then lets the running call finish and stops the ranks."""
    from tandem.rpc.server import run_server, serve
    from tandem.serving.worker_thread import WorkerThread

    if not group.is_front:
        group.follow()
        gc.freeze()
        return
    thread = WorkerThread(role)
    try:
        run_server(serve(servicers(thread), role=role, host=args.host, port=args.port, port_file=args.port_file))
    finally:
        thread.shutdown(wait=True)  # the running call finishes on every rank first
        _stopping.set()
        group.stop()
        # The interpreter's final garbage collection walks every model object (seconds on a busy
        # machine, past the launcher's grace period): the process is ending, skip it.
        gc.freeze()
