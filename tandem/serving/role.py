"""What a service's `__main__` tells the generic service process about its role.

A `Role` says which gRPC services the role serves, how a run's config lays it out (world
size, TP x PP x EP), and how to build one run's workers on a rank (`build`, every rank) and
its servicers over them (`servicers`, rank 0). tandem/serving/lifecycle.py calls these on
Configure and drops what they returned on Release; tandem/serving/process.py runs the process.

Deliberately not here: the workers and servicers themselves (services/<role>/).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from tandem.config import TandemConfig
from tandem.parallel.layout import ParallelConfig
from tandem.serving.startup import StartupClock


@dataclass
class Built:
    """One rank's share of a run: the rank group's targets, and rank-local extras the
    servicers need (a tokenizer, a front door)."""

    targets: dict[str, Any]
    extras: dict[str, Any] = field(default_factory=dict)
    closers: list = field(default_factory=list)  # called at release (e.g. a scorer's process pool)
    startup: StartupClock = field(default_factory=StartupClock)  # the build's timed phases (startup.py)


class Role(ABC):
    name: str  # actor | rollout | critic | reward
    service_names: tuple[str, ...]  # the role's gRPC services, e.g. ("tandem.v1.ActorService",)
    ranks_at_start: bool = True  # a long-lived process starts its rank group before any run
    imports_code: bool = False  # imports Python files a run's config names (only from --allow-dir)
    host: str = "127.0.0.1"  # the address this process serves on (set by process.run_service)

    def ranked(self, cfg: TandemConfig) -> bool:
        """Whether a run of `cfg` is served by a rank group (torch.distributed, megatron); the
        reward service's rules are not, its reward model is."""
        return True

    def section(self, cfg: TandemConfig):
        """services.<role>: world size, torch threads."""
        return getattr(cfg.services, self.name)

    def layout(self, cfg: TandemConfig) -> tuple[int, ParallelConfig]:
        """(world size, TP x PP x EP) the run needs; a different one restarts the ranks."""
        return self.section(cfg).world_size, ParallelConfig()

    def check_layout(self, cfg: TandemConfig) -> None:
        """ValueError naming the numbers when the run's layout cannot hold its model."""

    def validate_layout(self, cfg: TandemConfig, shape) -> None:
        """check_layout for a model of `shape` (tandem.models.spec.ModelShape): heads, query
        groups and experts against the run's TP x PP x EP and world size."""
        world, parallel = self.layout(cfg)
        parallel.validate(world, shape.num_attention_heads, shape.num_key_value_heads,
                          shape.moe.num_experts if shape.moe else 0)

    def seed(self, cfg: TandemConfig) -> int:
        return cfg.actor_rollout_ref.actor.megatron.seed

    @abstractmethod
    def build(self, cfg: TandemConfig) -> Built:
        """This rank's workers for a run of `cfg` (called on every rank, after seeding)."""

    @abstractmethod
    def servicers(self, cfg: TandemConfig, built: Built, group, thread) -> dict[str, Any]:
        """Rank 0: {service name: servicer} over the rank group, for the services this run uses."""
