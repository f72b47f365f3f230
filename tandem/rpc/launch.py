"""What every service's `__main__` does before it serves: arguments, logging, threads, ranks.

A service is started as `python -m services.<role> --config RUN.yaml [--port-file F]`.
The config is the run's resolved YAML (tandem.config); the role takes its own section.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch

from tandem.config import TandemConfig, load_config
from tandem.logging import configure_logging, get_logger


@dataclass
class ServiceArgs:
    cfg: TandemConfig
    host: str
    port: int
    port_file: str | None
    run_id: str | None


def parse_args(role: str, argv=None) -> ServiceArgs:
    p = argparse.ArgumentParser(prog=f"python -m services.{role}",
                                description=f"Tandem {role} service (gRPC)")
    p.add_argument("--config", help="run config YAML (defaults when omitted)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (see --port-file)")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--run-id", default=os.environ.get("TANDEM_RUN_ID"))
    p.add_argument("overrides", nargs="*", help="dotted config overrides, key=value")
    a = p.parse_args(argv)
    cfg = load_config(a.config, a.overrides)
    return ServiceArgs(cfg, a.host, a.port, a.port_file, a.run_id)


def init_service(role: str, args: ServiceArgs, torch_threads: int, seed: int):
    """Logging, torch threads, and a 1-rank process group with megatron parallel_state.

    (Multi-rank groups with a front door come with the Megatron-sharded roles issue.)
    """
    configure_logging(role=role, rank=0, run_id=args.run_id)
    torch.set_num_threads(max(1, torch_threads))
    if role != "reward":
        from tandem.dist.parallel import ParallelConfig, init_distributed

        init_distributed(ParallelConfig(), rank=0, world_size=1,
                         init_method=f"file://{_rendezvous_file(role)}", seed=seed)
    return get_logger(f"services.{role}")


def _rendezvous_file(role: str) -> str:
    import tempfile

    fd, path = tempfile.mkstemp(prefix=f"tandem-{role}-", suffix=".rdzv")
    os.close(fd)
    os.unlink(path)  # torch's FileStore creates it; a fresh name per process
    return path


def load_tokenizer(cfg: TandemConfig):
    from transformers import AutoTokenizer

    path = cfg.actor_rollout_ref.model.tokenizer_path
    if not path:
        raise ValueError("actor_rollout_ref.model.tokenizer_path must be set (the controller sets it)")
    return AutoTokenizer.from_pretrained(path)
