"""Parallel layout of one service's process group, validated once, and its initialisation.

A service is a group of tp x pp x cp x dp ranks (cp: context parallel, the sequence split). This module checks the layout against the
world size and the model shape (with every number in the message), starts
torch.distributed (gloo on CPU, NCCL on GPU) and megatron's parallel_state.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch

from tandem.parallel import cpu_compat, device


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    ep: int = 1  # expert parallel (MoE): experts split over ep ranks; expert TP = tp (megatron's default)
    cp: int = 1  # context parallel: each packed micro-batch split over cp ranks (tandem/models/context_parallel.py)

    def dp(self, world_size: int) -> int:
        return world_size // (self.tp * self.pp * self.cp)

    @classmethod
    def of(cls, megatron_cfg) -> "ParallelConfig":
        """A role's layout from its config section (tandem.config.MegatronConfig)."""
        return cls(megatron_cfg.tensor_model_parallel_size, megatron_cfg.pipeline_model_parallel_size,
                   megatron_cfg.expert_model_parallel_size, megatron_cfg.context_parallel_size)

    def validate(self, world_size: int, num_heads: int, num_query_groups: int, num_experts: int = 0) -> None:
        """num_experts: the model's routed experts (0: dense)."""
        problems = []
        if self.tp < 1 or self.pp < 1:
            problems.append(f"tensor_model_parallel_size={self.tp} and pipeline_model_parallel_size={self.pp} must be >= 1")
        elif world_size % (self.tp * self.pp):
            problems.append(f"world size {world_size} is not divisible by tp x pp = {self.tp} x {self.pp}")
        if self.cp < 1 or world_size % (self.tp * self.pp * self.cp):
            problems.append(f"context_parallel_size={self.cp}: world size {world_size} is not divisible "
                            f"by tp x pp x cp = {self.tp} x {self.pp} x {self.cp}")
        elif self.cp > 1 and self.ep > 1:
            problems.append(f"context_parallel_size={self.cp} with expert_model_parallel_size={self.ep} "
                            "is not offered yet")
        if num_heads % self.tp:
            problems.append(f"num_attention_heads={num_heads} is not divisible by tp={self.tp}")
        if num_query_groups % self.tp:
            problems.append(f"num_query_groups={num_query_groups} is not divisible by tp={self.tp}")
        if self.ep < 1 or world_size % (self.ep * self.tp * self.pp):
            problems.append(f"expert_model_parallel_size={self.ep}: world size {world_size} is not divisible "
                            f"by ep x tp x pp = {self.ep} x {self.tp} x {self.pp}")
        elif self.ep > 1 and not num_experts:
            problems.append(f"expert_model_parallel_size={self.ep} needs a model with experts (this one is dense)")
        elif num_experts % self.ep:
            problems.append(f"num_experts={num_experts} is not divisible by expert_model_parallel_size={self.ep}")
        if problems:
            raise ValueError("invalid parallel layout: " + "; ".join(problems))


def local_tcp_rendezvous() -> str:
    """`tcp://127.0.0.1:<free port>`: an init_method for ranks started together on this machine (tests,
    benches); rank 0's TCPStore binds the port (another process may take it first: rare, then retry)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def init_distributed(parallel: ParallelConfig, rank: int, world_size: int,
                     init_method: str | None = None, seed: int = 0, store=None) -> None:
    """Start torch.distributed and megatron parallel_state for this rank. The ranks meet through
    `store` (a torch TCPStore) or `init_method` (`tcp://host:port`, `env://`); a group of one
    needs neither (an in-memory HashStore)."""
    from megatron.core import parallel_state

    cpu_compat.install()
    device.set_local_device(int(os.environ.get("LOCAL_RANK", rank)))
    if not torch.distributed.is_initialized():
        if store is None and init_method is None:
            if world_size != 1:
                raise ValueError(f"{world_size} ranks need a rendezvous: a TCPStore or an init_method")
            store = torch.distributed.HashStore()
        torch.distributed.init_process_group(
            backend=device.backend(), init_method=init_method, store=store, rank=rank,
            world_size=world_size, timeout=datetime.timedelta(minutes=30))
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tp, pipeline_model_parallel_size=parallel.pp,
        expert_model_parallel_size=parallel.ep, context_parallel_size=parallel.cp)
    device.manual_seed(seed)
