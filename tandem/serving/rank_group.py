"""The control plane of a multi-rank service: rank 0 (the front door) runs methods on all ranks.

Rank 0 broadcasts (target, method), scatters each rank its arguments (by its DP rank, or
per rank for `run_ranks`), every rank runs the method, and rank 0 gathers the results of
the output ranks (TP rank 0 and CP rank 0 of the last pipeline stage), one per DP rank (every rank's
for `run_ranks`). All of this goes over a gloo group: commands
and batches are pickled CPU objects, small next to the model work they start. Ranks > 0
sit in `follow()` until rank 0 sends stop. One rank is a group of one with the same code.

A control-plane collective that fails means a rank is gone (killed, crashed): the group
cannot finish another call, so the process exits at once (RANK_LOST_EXIT) instead of
answering; its launcher restarts the whole service (controller/recovery.py).
"""
from __future__ import annotations

import os
import sys
import traceback
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from tandem.generation.interrupt import GenerationAborted
from tandem.logging import get_logger
from tandem.rpc import errors
from tandem.serving.call_observer import step_of_call

log = get_logger("tandem.rank_group")
# errors the servicers map to a status of their own: raised on rank 0 as the rank raised them
_RAISED_AS_IS = {"ValueError": ValueError, "GenerationAborted": GenerationAborted,
                 **{cls.__name__: cls for cls in (errors.InvalidArgument, errors.FailedPrecondition,
                                                  errors.ResourceExhausted, errors.NotFound, errors.Aborted)}}
RANK_LOST_EXIT = 3  # a service's exit code when one of its ranks died


def exit_rank_lost(**why) -> None:
    """This service lost a rank: log why and exit now (no cleanup can finish without it)."""
    log.error("service.rank_lost", exit_code=RANK_LOST_EXIT, **why)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RANK_LOST_EXIT)


@dataclass(frozen=True)
class RankInfo:
    rank: int
    dp: int
    tp: int
    pp: int
    is_output: bool  # TP rank 0 and CP rank 0 of the last pipeline stage


class RankGroup:
    def __init__(self, targets: dict[str, Any]):
        from megatron.core import parallel_state as ps

        self.targets = targets
        self.group = dist.new_group(backend="gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.dp_size = ps.get_data_parallel_world_size()
        me = RankInfo(self.rank, ps.get_data_parallel_rank(), ps.get_tensor_model_parallel_rank(),
                      ps.get_pipeline_model_parallel_rank(),
                      ps.get_tensor_model_parallel_rank() == 0 and ps.get_context_parallel_rank() == 0
                      and ps.is_pipeline_last_stage())
        infos: list = [None] * self.world
        dist.all_gather_object(infos, me, group=self.group)
        self.infos: list[RankInfo] = infos
        self.me = me
        self.output_ranks = sorted((i for i in infos if i.is_output), key=lambda i: i.dp)
        self.observer = None  # the held run's CallObserver (call_observer.py): steps, traces, compile time

    @property
    def is_front(self) -> bool:
        return self.rank == 0

    def run(self, target: str, method: str, per_dp_args: list[tuple | None]) -> list:
        """Rank 0: run target.method(*args) on every rank, each with the args of its DP rank
        (None = nothing to do there); -> the output ranks' results in DP order."""
        if len(per_dp_args) != self.dp_size:
            raise ValueError(f"{len(per_dp_args)} argument sets for {self.dp_size} DP ranks")
        gathered = self._call(target, method, [per_dp_args[i.dp] for i in self.infos], False)
        return [gathered[i.rank][0] for i in self.output_ranks]

    def run_ranks(self, target: str, method: str, per_rank_args: list[tuple]) -> list:
        """Rank 0: run target.method(*args) on every rank with its own args (ranks that work
        independently, e.g. TP=1 rollout replicas); -> every rank's result, in rank order."""
        if len(per_rank_args) != self.world:
            raise ValueError(f"{len(per_rank_args)} argument sets for {self.world} ranks")
        return [result for result, _ in self._call(target, method, per_rank_args, True)]

    def _call(self, target: str, method: str, per_rank_args: list, every: bool) -> list:
        step = step_of_call()  # every rank files the call under the caller's RL step
        if self.world == 1:  # a group of one: nothing to send (pickling a batch through gloo costs ms)
            return [self._execute(target, method, per_rank_args[0], every, step)]
        mine: list = [None]
        with self._peers_alive(target, method):
            dist.broadcast_object_list([(target, method, every, step)], src=0, group=self.group)
            dist.scatter_object_list(mine, per_rank_args, src=0, group=self.group)
        outcome = self._execute(target, method, mine[0], every, step)
        gathered: list = [None] * self.world
        with self._peers_alive(target, method):
            dist.gather_object(outcome, gathered, dst=0, group=self.group)
        for rank, (_, error) in enumerate(gathered):
            if error is not None:
                kind, message = error
                if kind in _RAISED_AS_IS:
                    raise _RAISED_AS_IS[kind](message)
                raise RuntimeError(f"rank {rank}: {kind}: {message}")
        return gathered

    def run_all(self, target: str, method: str, *args) -> list:
        """The same arguments on every DP rank."""
        return self.run(target, method, [args] * self.dp_size)

    def follow(self) -> None:
        """Ranks > 0: run what rank 0 sends until it sends stop."""
        while True:
            cmd: list = [None]
            mine: list = [None]
            with self._peers_alive("-", "-"):
                dist.broadcast_object_list(cmd, src=0, group=self.group)
                if cmd[0] is None:
                    return
                dist.scatter_object_list(mine, None, src=0, group=self.group)
            target, method, every, step = cmd[0]
            outcome = self._execute(target, method, mine[0], every, step)
            with self._peers_alive(target, method):
                dist.gather_object(outcome, None, dst=0, group=self.group)

    @contextmanager
    def _peers_alive(self, target: str, method: str):
        """A failed control-plane collective (gloo: a peer's connection is gone): exit."""
        try:
            yield
        except RuntimeError as e:
            exit_rank_lost(method=f"{target}.{method}", error=str(e))

    def stop(self) -> None:
        if self.world > 1:
            dist.broadcast_object_list([None], src=0, group=self.group)

    def _execute(self, target: str, method: str, args: tuple | None, every: bool = False, step: int | None = None):
        if args is None:
            return None, None
        try:
            with self.observer.call(step, f"{target}.{method}") if self.observer else nullcontext():
                result = getattr(self.targets[target], method)(*args)
            return (result if every or self.me.is_output else None), None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # reported to rank 0, which raises it for the RPC (torch's
            # CheckpointException is a BaseException: left alone, it would skip the gather)
            if self.world > 1:
                log.error("rank_call_failed", target=target, method=method, error=traceback.format_exc())
            if not self.is_front or self.world > 1:
                return None, (type(e).__name__, str(e))
            raise
