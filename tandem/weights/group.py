"""A weight process group: the actor's sending rank and a rollout's ranks, outside both worlds.

Each service has its own torch.distributed world (its default group). The weight group joins
one rank of the actor (rank 0, the broadcast source) and every rank of one rollout replica
(ranks 1..W) in a group of its own, built straight from torch's backend classes over a
TCPStore that the rollout's front hosts: `ProcessGroupNCCL(store, rank, size, timeout)` on GPUs,
`ProcessGroupGloo(...)` on CPU (the same code, so CPU tests run it). Both constructors exist
with this signature in torch 2.11 and 2.13. Collectives are called on the backend object
itself (`broadcast([tensor], opts).wait()`), never through torch.distributed's world API.

A failed collective (a peer died, a timeout) raises; the group is then dropped on every side
and built again by the next handshake.
"""
from __future__ import annotations

import datetime
import socket

import torch
import torch.distributed as dist

# The longest a source's rendezvous or collective waits for a receiver (JoinWeightGroup refuses
# more; a receiver configured longer asks for this): a bad or dead receiver holds the source's
# sending thread at most this long.
MAX_GROUP_TIMEOUT_S = 600.0


def free_port(host: str) -> int:
    """A port free on `host` now (the store binds it right after; a race is retried by the caller)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def backend_class(name: str):
    if name == "nccl":
        cls = getattr(dist, "ProcessGroupNCCL", None)
        if cls is None or not dist.is_nccl_available():
            raise RuntimeError("the nccl weight group needs a torch build with NCCL")
        return cls
    if name == "gloo":
        return dist.ProcessGroupGloo
    raise ValueError(f"weight group backend must be 'nccl' or 'gloo', got {name!r}")


class WeightGroup:
    """One rank's membership of a weight group (rank 0: the source)."""

    def __init__(self, group_id: str, host: str, port: int, rank: int, size: int, backend: str, timeout_s: float):
        self.group_id, self.rank, self.size, self.backend = group_id, rank, size, backend
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, size, is_master=False, timeout=timeout, wait_for_workers=False)
        # keys under the group's own prefix: a store never mixes two groups' rendezvous
        self.pg = backend_class(backend)(dist.PrefixStore(group_id, self.store), rank, size, timeout)

    @staticmethod
    def host_store(host: str, size: int, timeout_s: float) -> tuple[dist.TCPStore, int]:
        """The rendezvous store on a free port of `host` (kept by the receiver's front)."""
        for attempt in range(5):
            port = free_port(host)
            try:
                store = dist.TCPStore(host, port, size, is_master=True,
                                      timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
                return store, port
            except RuntimeError:  # the port was taken between free_port and bind
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        """`tensor` from rank `root` to every rank (blocking until done on this rank)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        self.pg.broadcast([tensor], opts).wait()

    def warm_up(self, device: torch.device) -> None:
        """One tiny broadcast: NCCL builds its communicator on the first collective, so a broken
        group shows in the handshake, not in the first sync."""
        self.broadcast(torch.zeros(1, device=device))

    def close(self) -> None:
        """Drop the group (a NCCL communicator is aborted: a peer may be gone)."""
        abort = getattr(self.pg, "abort", None)
        if self.backend == "nccl" and abort is not None:
            try:
                abort()
            except RuntimeError:
                pass
        self.pg = None
