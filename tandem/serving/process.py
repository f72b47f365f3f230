"""What every service's `__main__` does before it serves: arguments, logging, threads, ranks.

A service is started as `python -m services.<role> --config RUN.yaml [--host H] [--port P]
[--port-file F]`. The config is the run's resolved YAML (tandem.config); the role takes its
own section. It binds `--host` (default `services.<role>.host`, 127.0.0.1).

A service of several ranks (`services.<role>.world_size` > 1) is started in one of two ways:
- one process (no `--rank`): it is rank 0 (the gRPC front door); it validates the parallel
  layout, opens a TCPStore on a free port and starts ranks 1..N-1 as its child processes
  (`--rank i`, MASTER_ADDR/MASTER_PORT pointing at that store). Children die with rank 0
  (PR_SET_PDEATHSIG).
- every rank by someone else (by hand on several hosts, or the Ray launcher): each process gets
  `--rank i` and MASTER_ADDR/MASTER_PORT (or `--master-addr/--master-port`); rank 0 opens the
  TCPStore there and the others connect to it. torch.distributed's own data connections then
  use this host's address (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME pick the interface).
Either way the ranks meet over TCP (torch's TCPStore), never through a shared file.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import timedelta

import torch

from tandem.config import TandemConfig, load_config
from tandem.logging import configure_logging, get_logger
from tandem.rpc.security import PLAINTEXT, EndpointSecurity

RENDEZVOUS_TIMEOUT = timedelta(minutes=10)  # how long ranks wait for each other to come up


@dataclass
class ServiceArgs:
    cfg: TandemConfig
    host: str
    port: int
    port_file: str | None
    run_id: str | None
    config_path: str | None = None
    overrides: list = field(default_factory=list)
    rank: int | None = None  # None: this process is rank 0 and starts the other ranks itself
    master_addr: str | None = None
    master_port: int | None = None
    security: EndpointSecurity = PLAINTEXT  # TLS and token of this service's port (services.<role>.tls/.auth)


def parse_args(role: str, argv=None) -> ServiceArgs:
    p = argparse.ArgumentParser(prog=f"python -m services.{role}",
                                description=f"Tandem {role} service (gRPC)")
    p.add_argument("--config", help="run config YAML (defaults when omitted)")
    p.add_argument("--host", help=f"address to bind (default: services.{role}.host, 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (see --port-file)")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--run-id", default=os.environ.get("TANDEM_RUN_ID"))
    p.add_argument("--rank", type=int, help="this process's rank when every rank is started separately "
                                            "(by hand or by the Ray launcher); omit it to start all ranks here")
    p.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR"),
                   help="rank 0's rendezvous address (TCPStore) with --rank; default $MASTER_ADDR")
    p.add_argument("--master-port", type=int, default=_env_int("MASTER_PORT"),
                   help="rank 0's rendezvous port with --rank; default $MASTER_PORT")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, key=value")
    a = p.parse_args(argv)
    cfg = load_config(a.config, a.overrides)
    section = getattr(cfg.services, role)
    try:
        security = EndpointSecurity.from_section(section, f"services.{role}")
    except ValueError as e:
        p.error(str(e))
    return ServiceArgs(cfg, a.host or section.host, a.port, a.port_file, a.run_id, a.config, list(a.overrides),
                       a.rank, a.master_addr, a.master_port, security)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def init_service(role: str, args: ServiceArgs, torch_threads: int, seed: int, *,
                 parallel=None, world_size: int = 1, shape=None):
    """Logging, torch threads, and (for model roles) this rank's torch.distributed and
    megatron parallel_state. Rank 0 checks the layout against `shape` (heads, query
    groups, experts) and, unless the ranks are started separately, starts the others."""
    rank = args.rank or 0
    configure_logging(role=role, rank=rank, run_id=args.run_id)
    log = get_logger(f"services.{role}")
    # one line per rank process: how tests and operators count a service's processes (and, under
    # the Ray launcher, on which node each runs)
    log.info("service.process", pid=os.getpid(), world_size=world_size, host=socket.gethostname(),
             node_id=os.environ.get("TANDEM_NODE_ID"))
    torch.set_num_threads(max(1, torch_threads))
    if role == "reward" and shape is None:  # rules and functions only: no model, no ranks
        return log
    from tandem.parallel.layout import ParallelConfig, init_distributed

    parallel = parallel or ParallelConfig()
    if shape is not None:
        parallel.validate(world_size, shape.num_attention_heads, shape.num_key_value_heads,
                          shape.moe.num_experts if shape.moe else 0)
    store = _rendezvous(role, args, world_size, log)
    init_distributed(parallel, rank=rank, world_size=world_size, store=store, seed=seed)
    return log


def _rendezvous(role: str, args: ServiceArgs, world_size: int, log):
    """The TCPStore this rank meets the others through (None for a group of one)."""
    if world_size == 1 and not args.rank:
        return None
    if args.rank is None:  # rank 0 starting its ranks here: a store on a free port of this host
        store = torch.distributed.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                                           timeout=RENDEZVOUS_TIMEOUT, wait_for_workers=False)
        _start_other_ranks(role, args, world_size, "127.0.0.1", store.port)
        return store
    if not args.master_addr or not args.master_port:
        raise ValueError(f"{role} rank {args.rank} of {world_size}: the rendezvous is not set; give "
                         f"--master-addr/--master-port (or MASTER_ADDR/MASTER_PORT): rank 0's host and a free port")
    if not 0 <= args.rank < world_size:
        raise ValueError(f"{role}: --rank {args.rank} is outside services.{role}.world_size={world_size}")
    log.info("service.rendezvous", master_addr=args.master_addr, master_port=args.master_port)
    return torch.distributed.TCPStore(args.master_addr, args.master_port, world_size, is_master=args.rank == 0,
                                      timeout=RENDEZVOUS_TIMEOUT, wait_for_workers=False)


def _start_other_ranks(role: str, args: ServiceArgs, world_size: int, master_addr: str, master_port: int) -> None:
    base = [sys.executable, "-m", f"services.{role}"]
    if args.config_path:
        base += ["--config", args.config_path]
    if args.run_id:
        base += ["--run-id", args.run_id]
    for rank in range(1, world_size):
        env = dict(os.environ, LOCAL_RANK=str(rank), MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        subprocess.Popen(base + ["--rank", str(rank), *args.overrides], env=env,
                         preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


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
        return
    thread = WorkerThread(role)
    try:
        run_server(serve(servicers(thread), role=role, host=args.host, port=args.port, port_file=args.port_file,
                         security=args.security))
    finally:
        thread.shutdown(wait=True)  # the running call finishes on every rank first
        group.stop()
