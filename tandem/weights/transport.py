"""Which transport moves a version from the source to a rollout's ranks.

auto picks, from where the source's sending rank and every receiving rank run:
- `ipc` when every receiving rank is on the source's GPU (same machine, same GPU UUID: two
  processes sharing one GPU; the bytes never leave it);
- `collective` (a NCCL broadcast) when every rank is on a GPU with NCCL and none shares the
  source's GPU (NCCL allows one rank of a group per GPU);
- `stream` otherwise (CPU hosts, mixed placements, no NCCL): chunks over gRPC, which works
  between any two hosts that can reach each other.
An explicit choice that cannot work here is refused with the reason (`problem`); on CPU the
collective runs over gloo and `ipc` over a shared-memory file (tests, and hosts without NCCL;
auto never picks them on CPU).
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

STREAM, IPC, COLLECTIVE = "stream", "ipc", "collective"
# actor_rollout_ref.rollout.weight_sync.transport values -> transport (None: auto)
CONFIG_VALUES = {"auto": None, "stream": STREAM, "ipc": IPC, "nccl": COLLECTIVE, "collective": COLLECTIVE}


@dataclass(frozen=True)
class Placement:
    host_id: str
    device_type: str  # "cuda" | "cpu"
    device_uuid: str  # "" on CPU
    nccl: bool


def host_id() -> str:
    """This machine: hostname and boot id (two containers of one host differ by hostname)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def local_placement() -> Placement:
    from tandem.parallel import device

    cuda = device.has_cuda()
    return Placement(host_id(), "cuda" if cuda else "cpu", device.device_uuid(), device.nccl_available())


def _same_gpu(source: Placement, rank: Placement) -> bool:
    return (source.device_type == rank.device_type == "cuda" and source.host_id == rank.host_id
            and source.device_uuid == rank.device_uuid)


def problem(kind: str, source: Placement, ranks: list[Placement]) -> str | None:
    """Why `kind` cannot move weights from `source` to `ranks` (None: it can)."""
    if kind == IPC and source.device_type == "cpu":  # a shared-memory file (tests; CPU hosts)
        if not all(r.device_type == "cpu" and r.host_id == source.host_id for r in ranks):
            return "ipc from a CPU source needs every rollout rank on its host, on CPU (shared memory)"
    elif kind == IPC and not all(_same_gpu(source, r) for r in ranks):
        return "ipc needs every rollout rank on the source's GPU (same machine, same GPU)"
    if kind == COLLECTIVE:
        devices = {source.device_type, *(r.device_type for r in ranks)}
        if len(devices) > 1:
            return f"collective needs the source and every rollout rank on one device type, got {sorted(devices)}"
        if devices == {"cuda"}:
            if not (source.nccl and all(r.nccl for r in ranks)):
                return "collective on GPUs needs NCCL on the source and every rollout rank"
            if any(_same_gpu(source, r) for r in ranks):
                return "collective (NCCL) cannot put the source and a rollout rank on one GPU; use ipc"
    return None


def pick(configured: str | None, source: Placement, ranks: list[Placement]) -> str:
    """The transport to use: `configured` (a transport name, or None for auto)."""
    if configured is not None:
        return configured
    for kind in (IPC, COLLECTIVE):
        if source.device_type == "cuda" and problem(kind, source, ranks) is None:
            return kind
    return STREAM


def backend(source: Placement) -> str:
    """The collective's backend: NCCL between GPUs, gloo between CPU processes."""
    return "nccl" if source.device_type == "cuda" else "gloo"


def advertised_host(bind_host: str) -> str:
    """An address of this machine others can reach, from the host a service bound."""
    if bind_host not in ("", "0.0.0.0", "::", "[::]"):
        return bind_host
    return socket.gethostbyname(socket.gethostname())
