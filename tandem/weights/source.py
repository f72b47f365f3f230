"""The source side of the weight plane (the actor's front rank): each version exported once,
then served to every rollout replica from that one copy.

`snapshot(version)` exports the current version on the model's worker thread (the TP/PP/EP
gather of tandem/convert/reshard.py is collective over the actor's ranks) and keeps it on rank
0's device until a newer version is asked for. On a GPU the snapshot is one flat buffer in the
layout every transport moves (one device copy per version, one model's size of memory kept):
IPC then shares one handle and the reader makes one copy, a broadcast bucket and a stream block
are slices of it. On CPU it is the exported tensors themselves (at TP = PP = EP = 1 the
parameters: no copy). Transfers read it off the worker thread, several at once:
- `stream`: the manifest, chunks of a range of the flat layout (from a GPU through a pinned
  host block), then an end message;
- `share` / `release`: a CUDA IPC handle of the flat buffer, and the confirmation after the
  reader's copy;
- `join` / `broadcast`: a weight group per receiver (tandem/weights/group.py), buckets of the
  flat layout broadcast from rank 0.
A transfer that overlapped a weight update could be torn (a CPU snapshot may be the live
parameters), so every update first bumps the source's mutation count and a transfer ends by
checking the count is the one its snapshot was taken at (a seqlock): a torn transfer ends
ABORTED and the receiver keeps its old weights.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from tandem.logging import get_logger
from tandem.parallel import device
from tandem.rpc.errors import Aborted, FailedPrecondition, InvalidArgument, Unavailable
from tandem.weights import wire
from tandem.weights.group import WeightGroup
from tandem.weights.layout import Manifest, byte_view, pieces, ranges, views
from tandem.weights.transport import local_placement

log = get_logger("tandem.weights.source")
READ_BLOCK = 32 << 20  # device -> host per read when streaming from a GPU


@dataclass
class Snapshot:
    manifest: Manifest
    tensors: list[torch.Tensor]  # manifest order, contiguous, on the source's device
    epoch: int  # the source's mutation count when taken
    flat: torch.Tensor | None = None  # GPU: the flat layout (uint8), `tensors` are views of it


class WeightSource:
    """take(): on the model's worker thread, -> (version, mutation count, {TP=1 name: tensor});
    run_model(fn): await fn on that thread; mutations(): the current mutation count."""

    def __init__(self, take: Callable[[], tuple[int, int, dict]], run_model: Callable[..., Awaitable],
                 mutations: Callable[[], int], threads: int = 4):
        self._take, self._run_model, self._mutations = take, run_model, mutations
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tandem-weights")
        self._snapshot: Snapshot | None = None
        self._lock = asyncio.Lock()
        self._local = threading.local()  # each transfer thread's pinned host block
        self.groups: dict[str, WeightGroup] = {}  # receiver -> its group
        self.placement = local_placement()

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def snapshot(self, version: int | None = None) -> Snapshot:
        """The current version's snapshot (exported now if it is not the one kept); `version`,
        when given, must be the current one."""
        async with self._lock:
            snap = self._snapshot
            if snap is None or snap.epoch != self._mutations():
                flat = snap.flat if snap is not None else None  # reused when the size allows
                self._snapshot = snap = None  # the old copy goes first: its memory may be needed
                device.ipc_collect()
                current, epoch, weights = await self._run_model(self._take)
                snap = await self._run_model(_snapshot_of, current, epoch, weights, flat)
                self._snapshot = snap
                log.info("weights.snapshot", version=current, tensors=len(weights), bytes=snap.manifest.total_bytes)
        if version is not None and version != snap.manifest.version:
            raise FailedPrecondition(f"weights_version {version}: the source is at version {snap.manifest.version}")
        return snap

    def check_intact(self, snap: Snapshot) -> None:
        if self._mutations() != snap.epoch:
            raise Aborted(f"weights version {snap.manifest.version} changed while it was read "
                          "(an update ran during the sync); sync again")

    # ---- stream --------------------------------------------------------------------------
    async def stream(self, version: int, chunk_bytes: int, start: int = 0, end: int = 0) -> AsyncIterator:
        """The manifest, chunk messages (pre-serialized bytes) of the flat range [start, end)
        (end 0: the layout's end) in offset order, the end message."""
        snap = await self.snapshot(version)
        m = snap.manifest
        end = end or m.total_bytes
        if not 0 <= start <= end <= m.total_bytes:
            raise InvalidArgument(f"start, end: [{start}, {end}) is not inside the {m.total_bytes}-byte layout")
        yield wire.manifest_message(m)
        block = max(chunk_bytes, READ_BLOCK // chunk_bytes * chunk_bytes)
        for a, b in _sub(start, end, block):
            for message in await self._run(self._chunks, snap, a, b, chunk_bytes):
                yield message
        self.check_intact(snap)
        yield wire.end_message(m.version, end - start)

    def _chunks(self, snap: Snapshot, a: int, b: int, chunk_bytes: int) -> list[bytes]:
        """Chunk messages of the flat range [a, b): from the tensors' own memory on CPU, through
        one pinned host block from a GPU."""
        if snap.flat is None:
            host = [wire.tensor_bytes(byte_view(t)) for t in snap.tensors]
            return [wire.chunk_message(c0, _parts(snap.manifest, host, c0, c1)) for c0, c1 in _sub(a, b, chunk_bytes)]
        block = self._pinned(b - a)
        block[: b - a].copy_(snap.flat[a:b], non_blocking=True)
        device.synchronize()
        return [wire.chunk_message(c0, [wire.tensor_bytes(block[c0 - a: c1 - a])]) for c0, c1 in _sub(a, b, chunk_bytes)]

    def _pinned(self, n: int) -> torch.Tensor:
        buf = getattr(self._local, "block", None)
        if buf is None or buf.numel() < n:
            buf = self._local.block = device.pinned_empty(max(n, READ_BLOCK))
        return buf

    # ---- CUDA IPC ------------------------------------------------------------------------
    async def share(self, version: int) -> tuple[Manifest, str, dict]:
        """(manifest, GPU UUID, the IPC fields of the flat buffer)."""
        from tandem.weights import ipc

        snap = await self.snapshot(version)
        if snap.flat is None:
            raise FailedPrecondition("ipc: the source's weights are not on a GPU")
        return snap.manifest, self.placement.device_uuid, await self._run(ipc.share, snap.flat)

    async def release(self, version: int) -> None:
        """OK only if the shared tensors held `version` from the share until now."""
        snap = self._snapshot
        if snap is None or snap.manifest.version != version:
            raise Aborted(f"weights version {version} is no longer the source's (an update ran); sync again")
        self.check_intact(snap)

    # ---- weight groups -------------------------------------------------------------------
    async def join(self, group_id: str, receiver: str, host: str, port: int, size: int, backend: str,
                   timeout_s: float) -> None:
        """Join `receiver`'s new group as rank 0 (replacing its old one); returns once every
        rank has joined."""
        old = self.groups.pop(receiver, None)
        if old is not None:
            old.close()
        try:
            group = await self._run(WeightGroup, group_id, host, port, 0, size, backend, timeout_s)
            await self._run(group.warm_up, device.device())
        except RuntimeError as e:
            raise Unavailable(f"weight group {group_id}: joining failed: {e}") from None
        self.groups[receiver] = group
        log.info("weights.group_joined", group=group_id, receiver=receiver, size=size, backend=backend)

    async def broadcast(self, group_id: str, version: int, bucket_bytes: int) -> AsyncIterator:
        """('ready', manifest) once the request is good, then ('done', bytes) after the buckets."""
        found = [(r, g) for r, g in self.groups.items() if g.group_id == group_id]
        if not found:
            raise FailedPrecondition(f"weight group {group_id!r} is unknown here (the source restarted?); join again")
        receiver, group = found[0]
        snap = await self.snapshot(version)
        yield "ready", snap.manifest
        try:
            sent = await self._run(_send_buckets, snap, group, bucket_bytes)
        except RuntimeError as e:  # a receiver died or timed out: the group is unusable
            self.groups.pop(receiver, None)
            group.close()
            raise Unavailable(f"weight group {group_id}: broadcast failed: {e}") from None
        self.check_intact(snap)
        yield "done", sent


def _snapshot_of(version: int, epoch: int, weights: dict, flat: torch.Tensor | None) -> Snapshot:
    """The snapshot of exported weights: on a GPU copied into one flat buffer (`flat` reused if
    it has the size), on CPU the tensors as they are."""
    manifest = Manifest.of(version, weights)
    tensors = [t.contiguous() for t in weights.values()]
    if not tensors or tensors[0].device.type == "cpu":
        return Snapshot(manifest, tensors, epoch)
    if flat is None or flat.numel() != manifest.total_bytes:
        flat = torch.empty(manifest.total_bytes, dtype=torch.uint8, device=tensors[0].device)
    copies = views(flat, manifest)
    torch._foreach_copy_(copies, tensors)
    device.synchronize()
    return Snapshot(manifest, copies, epoch, flat)


def _sub(a: int, b: int, size: int) -> list[tuple[int, int]]:
    return [(a + x, a + y) for x, y in ranges(b - a, size)]


def _parts(manifest: Manifest, host: list, a: int, b: int) -> list:
    """The bytes of the flat range [a, b) as buffers: tensor bytes, zeros for the padding."""
    out, at = [], a
    for i, lo, hi in pieces(manifest, a, b):
        start = manifest.tensors[i].offset + lo
        if start > at:
            out.append(wire.zeros(start - at))
        out.append(host[i][lo:hi])
        at = start + hi - lo
    if at < b:
        out.append(wire.zeros(b - at))
    return out


def _send_buckets(snap: Snapshot, group: WeightGroup, bucket_bytes: int) -> int:
    """Broadcast the flat layout from rank 0 in buckets of bucket_bytes (a bucket inside one
    tensor goes straight from it; others are assembled in one reused device buffer)."""
    m = snap.manifest
    bucket = None
    for a, b in ranges(m.total_bytes, bucket_bytes):
        if snap.flat is not None:
            group.broadcast(snap.flat[a:b])
            continue
        ps = list(pieces(m, a, b))
        if len(ps) == 1 and ps[0][2] - ps[0][1] == b - a:
            i, lo, hi = ps[0]
            group.broadcast(byte_view(snap.tensors[i])[lo:hi])
            continue
        if bucket is None:
            bucket = torch.empty(min(bucket_bytes, m.total_bytes), dtype=torch.uint8, device=snap.tensors[0].device)
        for i, lo, hi in ps:
            at = m.tensors[i].offset + lo - a
            bucket[at: at + hi - lo].copy_(byte_view(snap.tensors[i])[lo:hi])
        group.broadcast(bucket[: b - a])
    device.synchronize()
    return m.total_bytes
