"""What every service's `__main__` runs: arguments, logging, the run it holds, the gRPC server.

Two ways to start a service (rank 0, the gRPC front door):

- long-lived: `python -m services.<role> [--host H] [--port P | --port-file F] [--world-size N]`
  starts with only what the process needs (role, bind address, ranks; the device follows
  LOCAL_RANK) and holds no run: it waits for tandem.v1.LifecycleService.Configure (the run's
  resolved config), serves that run until Release, then the next (tandem/serving/lifecycle.py).
- for one run: `python -m services.<role> --config RUN.yaml [key=value ...]` (or overrides
  alone, on the defaults) configures itself with that config before it serves (what `tandem
  run`'s local launcher does); Release and Configure work on it as on a long-lived one.
- long-lived with settings: `--long-lived` with a config or overrides holds no run either;
  the config then sets only this process's bind address, TLS and token
  (services.<role>.host, .tls, .auth).

A service of several ranks starts ranks 1..N-1 as child processes of the same module
(`--rank i`, with the rendezvous file and the layout); they follow rank 0's commands,
configure included, and die with rank 0 (PR_SET_PDEATHSIG). A run that needs another world
size or layout restarts them.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from tandem.config import TandemConfig, load_config, to_yaml
from tandem.logging import configure_logging, get_logger
from tandem.parallel.layout import ParallelConfig
from tandem.rpc.security import PLAINTEXT, EndpointSecurity
from tandem.serving.role import Role


@dataclass
class ServiceArgs:
    host: str
    port: int
    port_file: str | None
    run_id: str | None
    config_path: str | None = None
    overrides: list = field(default_factory=list)
    world_size: int = 1
    rank: int = 0
    rendezvous: str | None = None
    layout: ParallelConfig = field(default_factory=ParallelConfig)
    security: EndpointSecurity = PLAINTEXT  # TLS and token of this service's port (services.<role>.tls/.auth)
    long_lived: bool = False
    cfg: TandemConfig | None = None  # defaults <- --config <- overrides

    @property
    def configure_at_start(self) -> bool:
        return not self.long_lived and (self.config_path is not None or bool(self.overrides))


def _layout(text: str) -> ParallelConfig:
    tp, pp, ep = (int(x) for x in text.split(","))
    return ParallelConfig(tp, pp, ep)


def parse_args(role: str, argv=None) -> ServiceArgs:
    p = argparse.ArgumentParser(prog=f"python -m services.{role}",
                                description=f"Tandem {role} service (gRPC). Without --config or overrides it "
                                            "holds no run until tandem.v1.LifecycleService.Configure.")
    p.add_argument("--config", help="a run config YAML: configure with it at start (one-run mode)")
    p.add_argument("--host", help="address to bind (default: services.<role>.host, 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (see --port-file)")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--world-size", type=int, default=1,
                   help="ranks to start with (long-lived mode; a run that needs another number restarts them)")
    p.add_argument("--run-id", default=os.environ.get("TANDEM_RUN_ID"), help="the run id of --config's run")
    p.add_argument("--long-lived", action="store_true",
                   help="hold no run at start even with --config / overrides (they set only host, TLS, token)")
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)  # set by rank 0 for its children
    p.add_argument("--rendezvous", help=argparse.SUPPRESS)
    p.add_argument("--layout", type=_layout, default=ParallelConfig(), help=argparse.SUPPRESS)
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
    return ServiceArgs(a.host or section.host, a.port, a.port_file, a.run_id, a.config, list(a.overrides),
                       a.world_size, a.rank, a.rendezvous, a.layout, security, a.long_lived, cfg)


def load_tokenizer(cfg: TandemConfig):
    from transformers import AutoTokenizer

    path = cfg.actor_rollout_ref.model.tokenizer_path
    if not path:
        raise ValueError("actor_rollout_ref.model.tokenizer_path must be set (the controller sets it)")
    return AutoTokenizer.from_pretrained(path)


def run_service(role: Role, argv=None) -> None:
    """A service process of `role` (see the module docstring) until SIGTERM."""
    args = parse_args(role.name, argv)
    if args.rank > 0:
        _follow(role, args)
        return
    from tandem.rpc.server import run_server
    from tandem.serving.lifecycle import RunHost
    from tandem.serving.worker_thread import WorkerThread

    configure_logging(role=role.name, rank=0, run_id=args.run_id)
    # one line per rank process: how tests and operators count a service's processes
    get_logger(f"services.{role.name}").info("service.process", pid=os.getpid(), world_size=args.world_size)
    host, thread = RunHost(role), WorkerThread(role.name)
    try:
        if args.configure_at_start:  # every model call, this one included, runs on the worker thread
            host.check_caller = args.run_id is not None  # started by hand: any caller's run id
            thread.call(host.configure, args.run_id or "local", to_yaml(args.cfg), thread)
        elif role.ranks_at_start:
            thread.call(host.start_group, args.world_size, ParallelConfig())
        run_server(_serve(role, args, host, thread))
    finally:
        thread.shutdown(wait=True)  # the running call finishes on every rank first
        host.stop_group()


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
                security=args.security, health_servicer=health_servicer,
                held=lambda name: name in role.service_names and name not in host.servicers)


def _follow(role: Role, args: ServiceArgs) -> None:
    """Ranks > 0: join rank 0's group and run its commands (configure, release, work) until stop."""
    from tandem.parallel.layout import init_distributed
    from tandem.serving.lifecycle import LIFECYCLE, RankHost
    from tandem.serving.rank_group import RankGroup

    configure_logging(role=role.name, rank=args.rank)
    get_logger(f"services.{role.name}").info("service.process", pid=os.getpid(), world_size=args.world_size)
    init_distributed(args.layout, rank=args.rank, world_size=args.world_size,
                     init_method=f"file://{args.rendezvous}", seed=0)
    host = RankHost(role, args.rank)
    host.group = RankGroup({LIFECYCLE: host})
    host.group.follow()
