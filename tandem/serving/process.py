"""What every service's `__main__` runs: arguments, logging, the run it holds, the gRPC server.

Three ways to start a service (rank 0, the gRPC front door); it binds `--host` (default
`services.<role>.host`, 127.0.0.1), and refuses an address beyond loopback without a bearer
token unless given `--insecure`; a run's config may name Python files for it to import only
from its `--allow-dir` directories (tandem/serving/allowed_dirs.py):

- long-lived: `python -m tandem.services.<role> [--host H] [--port P | --port-file F] [--world-size N]`
  starts with only what the process needs (role, bind address, ranks; the device follows
  LOCAL_RANK) and holds no run: it waits for tandem.v1.LifecycleService.Configure (the run's
  resolved config), serves that run until Release, then the next (tandem/serving/lifecycle.py).
  With `--long-lived`, a config and overrides set only this process's bind address, TLS and
  token (services.<role>.host, .tls, .auth).
- for one run: `python -m tandem.services.<role> --config RUN.yaml [key=value ...]` (or overrides
  alone, on the defaults) configures itself with that config before it serves (what the local,
  compose and Ray launchers start); Release and Configure work on it as on a long-lived one.

Ranks: rank 0 started alone (no `--rank`) opens a TCPStore on a free port and starts ranks
1..N-1 as its children (`--rank i`, MASTER_ADDR/MASTER_PORT pointing at that store); they
follow rank 0's commands, configure included, and die with it (PR_SET_PDEATHSIG, set by the child); a run that
needs another world size or layout restarts them. Ranks started by someone else (by hand on
several hosts, or the Ray launcher) each get `--rank i --config RUN.yaml` and
MASTER_ADDR/MASTER_PORT (or `--master-addr/--master-port`): rank 0 opens the TCPStore there
and the others connect to it; their layout is the config's and cannot change (a run that
needs another is refused). Either way the ranks meet over TCP, never through a shared file.
A service that loses a rank cannot finish a collective, so it exits (rank_group.RANK_LOST_EXIT;
rank 0 also watches the ranks it started: lifecycle.py) and its launcher restarts it whole
(controller/recovery.py).
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import NoReturn

import torch

from tandem.config import TandemConfig, load_config, to_yaml
from tandem.logging import configure_logging, get_logger
from tandem.parallel.layout import ParallelConfig
from tandem.process_exit import exit_process
from tandem.rpc.exposure import exposure_problem
from tandem.rpc.security import PLAINTEXT, EndpointSecurity
from tandem.serving.lifecycle import RENDEZVOUS_TIMEOUT
from tandem.serving.role import Role
from tandem.serving.startup import since_process_start


@dataclass
class ServiceArgs:
    host: str
    port: int
    port_file: str | None
    run_id: str | None
    config_path: str | None = None
    overrides: list = field(default_factory=list)
    world_size: int = 1
    rank: int | None = None  # None: this process is rank 0 and starts the other ranks itself
    master_addr: str | None = None
    master_port: int | None = None
    layout: ParallelConfig | None = None  # a child rank's layout, from the rank 0 that started it
    security: EndpointSecurity = PLAINTEXT  # TLS and token of this service's port (services.<role>.tls/.auth)
    metrics_port: int | None = None  # Prometheus /metrics on rank 0 (0: any free port, logged)
    long_lived: bool = False
    cfg: TandemConfig | None = None  # defaults <- --config <- overrides
    allow_dirs: list = field(default_factory=list)  # where a run's config may name code to import

    @property
    def configure_at_start(self) -> bool:
        return not self.long_lived and (self.config_path is not None or bool(self.overrides))


def _layout(text: str) -> ParallelConfig:
    return ParallelConfig(*(int(x) for x in text.split(",")))  # tp,pp,ep[,cp]


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def parse_args(role: str, argv=None) -> ServiceArgs:
    p = argparse.ArgumentParser(prog=f"python -m tandem.services.{role}",
                                description=f"Tandem {role} service (gRPC). Without --config or overrides it "
                                            "holds no run until tandem.v1.LifecycleService.Configure.")
    p.add_argument("--config", help="a run config YAML: configure with it at start (one-run mode)")
    p.add_argument("--host", help=f"address to bind (default: services.{role}.host, 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (see --port-file)")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--world-size", type=int, default=1,
                   help="ranks to start with (long-lived mode; a run that needs another number restarts them)")
    p.add_argument("--run-id", default=os.environ.get("TANDEM_RUN_ID"), help="the run id of --config's run")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port "
                   f"(default: services.{role}.metrics_port; 0 = any free port)")
    p.add_argument("--long-lived", action="store_true",
                   help="hold no run at start even with --config / overrides (they set only host, TLS, token)")
    p.add_argument("--rank", type=int, help="this process's rank when every rank is started separately "
                                            "(by hand or by the Ray launcher); omit it to start all ranks here")
    p.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR"),
                   help="rank 0's rendezvous address (TCPStore) with --rank; default $MASTER_ADDR")
    p.add_argument("--master-port", type=int, default=_env_int("MASTER_PORT"),
                   help="rank 0's rendezvous port with --rank; default $MASTER_PORT")
    p.add_argument("--allow-dir", action="append", default=[], metavar="DIR",
                   help="import the Python files a run's config names (custom_reward_function.path) only from "
                        "this directory (repeatable; none: no such file is imported)")
    p.add_argument("--insecure", action="store_true",
                   help="serve on an address beyond loopback (--host) without a bearer token")
    p.add_argument("--layout", type=_layout, help=argparse.SUPPRESS)  # tp,pp,ep,cp of a child rank 0 started
    p.add_argument("overrides", nargs="*", help="dotted config overrides, key=value (one-run mode)")
    a = p.parse_args(argv)
    if a.world_size < 1:
        p.error(f"--world-size must be >= 1, got {a.world_size}")
    cfg = load_config(a.config, a.overrides)
    section = getattr(cfg.services, role)
    try:
        security = EndpointSecurity.from_section(section, f"services.{role}")
    except ValueError as e:
        p.error(str(e))
    host = a.host or section.host
    if not a.rank and (problem := exposure_problem(host, security.token is not None, a.insecure)):
        p.error(f"--host {host}: {problem} (services.{role}.auth.token_file or .token_env): set one, "
                "or pass --insecure to serve without")
    metrics_port = a.metrics_port if a.metrics_port is not None else section.metrics_port
    return ServiceArgs(host, a.port, a.port_file, a.run_id, a.config, list(a.overrides),
                       a.world_size, a.rank, a.master_addr, a.master_port, a.layout, security, metrics_port,
                       a.long_lived, cfg, list(a.allow_dir))


def load_tokenizer(cfg: TandemConfig):
    from tandem.tokenizer import load_tokenizer as load

    path = cfg.actor_rollout_ref.model.tokenizer_path
    if not path:
        raise ValueError("actor_rollout_ref.model.tokenizer_path must be set (the controller sets it)")
    return load(path)


def _rank_layout(role: Role, args: ServiceArgs) -> tuple[int, ParallelConfig]:
    """(world size, layout) of a rank started with --rank: the rank 0 that started it says, else its config."""
    return (args.world_size, args.layout) if args.layout is not None else role.layout(args.cfg)


def _rendezvous(role: str, args: ServiceArgs, world_size: int, log):
    """The TCPStore a separately started rank meets the others through (None for a group of one)."""
    if world_size == 1 and not args.rank:
        return None
    if not args.master_addr or not args.master_port:
        raise ValueError(f"{role} rank {args.rank} of {world_size}: the rendezvous is not set; give "
                         f"--master-addr/--master-port (or MASTER_ADDR/MASTER_PORT): rank 0's host and a free port")
    if not 0 <= args.rank < world_size:
        raise ValueError(f"{role}: --rank {args.rank} is outside services.{role}.world_size={world_size}")
    log.info("service.rendezvous", master_addr=args.master_addr, master_port=args.master_port)
    return torch.distributed.TCPStore(args.master_addr, args.master_port, world_size, is_master=args.rank == 0,
                                      timeout=RENDEZVOUS_TIMEOUT, wait_for_workers=False)


def _log_process(role: Role, rank: int, world_size: int, run_id: str | None = None):
    configure_logging(role=role.name, rank=rank, run_id=run_id)
    # `kill -USR1 PID`: every thread's Python stack into the log (a hung call: where it waits)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    log = get_logger(f"services.{role.name}")
    # one line per rank process: how tests and operators count a service's processes (and, under
    # the Ray launcher, on which node each runs)
    log.info("service.process", pid=os.getpid(), world_size=world_size, host=socket.gethostname(),
             node_id=os.environ.get("TANDEM_NODE_ID"))
    return log


def run_service(role: Role, argv=None) -> NoReturn:
    """A service process of `role` (see the module docstring) until SIGTERM; then the process ends
    (tandem/process_exit.py: without the interpreter's seconds-long teardown)."""
    args = parse_args(role.name, argv)
    role.host = args.host
    if args.rank:
        _follow(role, args)
        exit_process(0)
    from tandem.rpc.server import run_server
    from tandem.serving.lifecycle import RunHost
    from tandem.serving.worker_thread import WorkerThread

    separate = args.rank == 0  # the other ranks were started by someone else
    world = role.layout(args.cfg)[0] if separate else args.world_size
    log = _log_process(role, 0, world, args.run_id)
    host, thread = RunHost(role, args.allow_dirs), WorkerThread(role.name)
    try:  # every model call, these included, runs on the worker thread
        if separate:
            world, parallel = role.layout(args.cfg)
            thread.call(host.attach_group, world, parallel, _rendezvous(role.name, args, world, log))
        elif role.ranks_at_start and not args.configure_at_start:
            thread.call(host.start_group, args.world_size, ParallelConfig())
        if args.configure_at_start:
            host.check_caller = False  # a run given at start: any caller's run id (launchers tag their own)
            host.process_start_s = since_process_start()  # the first phase of its start-up report
            thread.call(host.configure, args.run_id or "local", to_yaml(args.cfg), thread)
        run_server(_serve(role, args, host, thread))
    finally:
        try:  # after the running call, on every rank
            thread.call(host.rank_host.close_observer)  # an open trace is written (other ranks: _follow)
            # on the thread that started the ranks: their parent-death signal (SIGKILL) fires when that
            # thread ends, which would kill them before their own exit (an async-checkpoint writer left)
            thread.call(host.stop_group)
        except RuntimeError:  # the thread is already shut down
            host.stop_group()
        thread.shutdown(wait=True)
    exit_process(0)


async def _serve(role: Role, args: ServiceArgs, host, thread) -> None:
    from grpc_health.v1 import health

    from tandem.rpc.server import serve
    from tandem.serving.lifecycle_servicer import SERVICE as LIFECYCLE_SERVICE
    from tandem.serving.lifecycle_servicer import LifecycleServicer
    from tandem.serving.slot import SlotServicer

    health_servicer = health.aio.HealthServicer()
    servicers = [(LIFECYCLE_SERVICE, LifecycleServicer(host, thread, health_servicer))]
    servicers += [(name, SlotServicer(host, name)) for name in role.service_names]
    await serve(servicers, role=role.name, host=args.host, port=args.port, port_file=args.port_file,
                security=args.security, metrics_port=args.metrics_port, health_servicer=health_servicer,
                held=lambda name: name in role.service_names and name not in host.servicers)


def _follow(role: Role, args: ServiceArgs) -> None:
    """Ranks > 0: join rank 0's group and run its commands (configure, release, work) until stop."""
    from tandem.parallel.layout import init_distributed
    from tandem.serving.lifecycle import LIFECYCLE, RankHost
    from tandem.serving.parent import die_with_parent
    from tandem.serving.rank_group import RankGroup

    die_with_parent()
    world, parallel = _rank_layout(role, args)
    log = _log_process(role, args.rank, world)
    init_distributed(parallel, rank=args.rank, world_size=world, store=_rendezvous(role.name, args, world, log))
    host = RankHost(role, args.rank)
    host.group = RankGroup({LIFECYCLE: host})
    host.group.follow()
    host.close_observer()  # rank 0 said stop: an open trace is written
