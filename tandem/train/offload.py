"""Tensors' storage moved to host memory and back, with the tensors themselves kept.

A `HostStash` takes tensors (a model's parameters, an optimizer's fp32 main weights and Adam
moments), copies each distinct storage into a host buffer and shrinks the device storage to
nothing: megatron-core's own way of freeing its buffers (`_ParamAndGradBuffer.offload_to_cpu`,
`storage().resize_(0)`), applied to any tensor. Every tensor object, view and reference stays
valid (optimizer state dicts, megatron's main-parameter lists, DDP's views into its buffers, the
generation engine's weight views) and gets its bytes back on `reload`, at a new device address.
Host buffers are pinned with CUDA and kept for reuse, so a stash costs its host memory once.
On CPU the same moves happen between two host buffers: the bookkeeping (what is where, nothing
lost) is what the CPU tests exercise.

Why not megatron's `MegatronOptimizer.offload_to_cpu()` for optimizer state: it moves every
parameter its torch optimizer holds, which for an fp32 model are the model's own weights (the
colocated rollout generates on them), and it allocates pageable host memory on every call.

Deliberately not here: which state moves when (phases.py); gradient buffers, which are not
copied but dropped (megatron's `DistributedDataParallel.offload_grad_buffers`).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import torch

from tandem.parallel import device


def distinct_storages(tensors: Iterable[torch.Tensor], exclude: Iterable[torch.Tensor] = ()) -> list:
    """The storages of `tensors` on this process's device, each once, without empty ones (already
    stashed) and without those of `exclude` (e.g. the model's weights among an optimizer's tensors)."""
    here = device.device()
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen, out = set(), []
    for t in tensors:
        if t.device != here:
            continue  # already in host memory (megatron's CPU optimizer part)
        s = t.untyped_storage()
        if s.nbytes() == 0 or s.data_ptr() in skip or s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        out.append(s)
    return out


def _bytes(storage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class HostStash:
    """Storages parked in host memory; `offload` / `reload` move them, `nbytes_on_host` says how much is out."""

    def __init__(self):
        self._held: list[tuple[object, torch.Tensor]] = []  # (device storage, its bytes on the host)
        self._spare: dict[int, list[torch.Tensor]] = defaultdict(list)  # host buffers by size, for reuse
        self._copies = device.CopyStream()
        self._reloaded = None  # event: the last reload's copies have run
        # device storage (by address) -> the host buffer it was last reloaded from: the same bytes until written
        self._mirror: dict[int, torch.Tensor] = {}

    @property
    def nbytes_on_host(self) -> int:
        return sum(host.numel() for _, host in self._held)

    def offload(self, storages: list, unchanged: bool = False) -> int:
        """Copy `storages` (from `distinct_storages`) to host memory, then free them on the device.
        unchanged: the caller knows nothing wrote them since the last reload, so those whose bytes are
        still in the host buffer they came from are freed without a copy. -> bytes copied."""
        device.wait_on_host(self._reloaded)  # host buffers a reload may still be reading
        reuse, sizes = {}, {s.data_ptr(): s.nbytes() for s in storages}
        for ptr, host in self._mirror.items():
            if unchanged and sizes.get(ptr) == host.numel():
                reuse[ptr] = host
            else:
                self._spare[host.numel()].append(host)
        self._mirror = {}
        moved, copied = [], 0
        with self._copies.run():
            for s in storages:
                host = reuse.pop(s.data_ptr(), None)
                if host is None:
                    host = self._spare[s.nbytes()].pop() if self._spare[s.nbytes()] else device.host_bytes(s.nbytes())
                    host.copy_(_bytes(s), non_blocking=True)
                    copied += host.numel()
                moved.append((s, host))
        device.wait_on_host(self._copies.record())  # the bytes are out before the storage goes
        for s, _ in moved:
            s.resize_(0)
        self._held.extend(moved)
        return copied

    def reload(self, wait: bool = True) -> int:
        """Give every stashed storage its bytes back. With CUDA the copies run on a side stream and
        the host does not wait: wait=True makes the current stream wait for them at once, wait=False
        leaves that to `ready()` (called just before the tensors are used). -> bytes moved."""
        if not self._held:
            return 0
        held = self._held
        try:
            for s, host in held:
                s.resize_(host.numel())  # allocated for the current stream, which waits before any use
        except BaseException:  # out of device memory: all of it stays stashed, nothing is lost
            for s, _ in held:
                s.resize_(0)
            raise
        self._held = []
        with self._copies.run():
            for s, host in held:
                _bytes(s).copy_(host, non_blocking=True)
        self._reloaded = self._copies.record()
        self._mirror = {s.data_ptr(): host for s, host in held}
        if wait:
            self.ready()
        return sum(host.numel() for _, host in held)

    def ready(self) -> None:
        """The current stream waits for the last reload's copies (a device-side wait)."""
        device.wait_on_device(self._reloaded)

    def drop(self) -> None:
        """Forget what is stashed and the spare buffers (the state's owner is being discarded)."""
        device.wait_on_host(self._reloaded)
        self._held, self._spare, self._mirror = [], defaultdict(list), {}

    def free_host_memory(self) -> None:
        """Drop the spare host buffers (what is stashed stays)."""
        device.wait_on_host(self._reloaded)
        self._spare.clear()
        self._mirror.clear()
