"""Room on disk for a checkpoint: the bytes a save writes against the free space where it goes.

A save that cannot fit must fail at once with a message a person can act on (RESOURCE_EXHAUSTED
naming the path, the bytes it needs and the bytes free), not deep inside torch's writer, whose
error on a full disk says neither ("unexpected pos 704 vs 598"). `measure` is called by every
rank before a save (tandem/checkpoint.py) and gives each the same answer; `save_failed` turns a
failed write into that error when the disk is what ran out. The controller checks its own side
before each save against the size of the run's last checkpoint (controller/checkpointing.py).

Deliberately not here: writing or cleaning up checkpoint directories (tandem/checkpoint.py).
"""
from __future__ import annotations

import errno
import os
import shutil

import torch
import torch.distributed as dist

from tandem.rpc.errors import ResourceExhausted

# what the file format adds per tensor (zip entry, alignment, its line in .metadata): measured
# 2.6-3.1 kB on a tiny model; rounded up so that a save that passes the check fits
PER_TENSOR_BYTES = 4096
# free space below this when a write fails: the disk ran out (torch's writer reports a short
# write as "unexpected pos", not ENOSPC)
NEARLY_FULL_BYTES = 1 << 20


def human(n: int) -> str:
    """1234567 -> '1.2 MB' (decimal units, as df -H prints them)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"  # pragma: no cover - the loop returns


def no_room(path: str, needed: int, free: int, why: str = "") -> ResourceExhausted:
    """The error of a checkpoint that does not fit, naming the path and both sizes."""
    return ResourceExhausted(f"no room for checkpoint {path}: it needs {needed} bytes ({human(needed)}){why}, "
                             f"{free} bytes ({human(free)}) are free there")


def free_bytes(path: str) -> int:
    """Free bytes of the filesystem holding `path` (or its nearest existing parent)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def bytes_to_write(state: dict) -> int:
    """This rank's share of a sharded state dict on disk: the main replica of each sharded tensor
    (data-parallel copies are written once) and every plain tensor."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedBase, is_main_replica

    total = 0
    for value in nested_values(state):
        data = getattr(value, "data", None) if isinstance(value, ShardedBase) else value
        if isinstance(value, ShardedBase) and not is_main_replica(value.replica_id):
            continue
        if isinstance(data, torch.Tensor):
            total += data.numel() * data.element_size() + PER_TENSOR_BYTES
    return total


def measure(state: dict, path: str) -> tuple[int, int]:
    """All ranks: (bytes the save of `state` to `path` writes over every rank, the least free
    space any rank sees there), the same on every rank so that all refuse or none does."""
    mine = (bytes_to_write(state), free_bytes(os.path.dirname(path)))
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return mine
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return sum(b for b, _ in everyone), min(f for _, f in everyone)


def _disk_ran_out(error: BaseException) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def describe(error: BaseException) -> str:
    """One line for a failed write: torch's CheckpointException lists each rank's own error."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, (cause, *_) = next(iter(failures.items()))
        return f"rank {rank}: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
    text = str(error).splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def save_failed(path: str, error: BaseException, needed: int, free_at_failure: int) -> Exception:
    """The error to raise for a save of `path` that failed with `error` (call it once its partial
    files are removed): RESOURCE_EXHAUSTED when the disk ran out, else a RuntimeError saying what failed."""
    if _disk_ran_out(error) or free_at_failure < NEARLY_FULL_BYTES:
        return no_room(path, needed, free_bytes(os.path.dirname(path)),
                       why=f" (the write failed: {describe(error)})")
    return RuntimeError(f"saving checkpoint {path} failed: {describe(error)}")
