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
- `share`: the version in the source's export buffer, kept across versions and shared once
  (tandem/weights/shared.py: CUDA IPC on a GPU, a shared-memory file on CPU; the reader checks
  the buffer's seqlock stamp after its copy); `release` answers older readers;
- `join` / `broadcast`: a weight group per receiver (tandem/weights/group.py), buckets of the
  flat layout broadcast from rank 0.
A transfer that overlapped a weight update could be torn (a CPU snapshot may be the live
parameters), so every update first bumps the source's mutation count and a transfer ends by
checking the count is the one its snapshot was taken at (a seqlock): a torn transfer ends
ABORTED and the receiver keeps its old weights.
"""
from __future__ import annotations

import asyncio
import itertools
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
from tandem.weights.shared import ExportBuffer, ShareReply
from tandem.weights.transport import local_placement

log = get_logger("tandem.weights.source")
READ_BLOCK = 32 << 20  # device -> host per read when streaming from a GPU


@dataclass
class Snapshot:
    manifest: Manifest
    tensors: list[torch.Tensor]  # manifest order, contiguous, on the source's device
    epoch: int  # the source's mutation count when taken
    flat: torch.Tensor | None = None  # GPU: the flat layout (uint8), `tensors` are views of it
    export: ExportBuffer | None = None  # the shared buffer holding this version (GPU: always; CPU: once shared)
    stamp: int = 0  # the export buffer's stamp while it holds this snapshot


class WeightSource:
    """take(): on the model's worker thread, -> (version, mutation count, {TP=1 name: tensor});
    run_model(fn): await fn on that thread; mutations(): the current mutation count; store_hosts:
    weight-group rendezvous hosts accepted besides the caller's own address."""

    def __init__(self, take: Callable[[], tuple[int, int, dict]], run_model: Callable[..., Awaitable],
                 mutations: Callable[[], int], threads: int = 4, store_hosts: tuple[str, ...] = ()):
        self._take, self._run_model, self._mutations = take, run_model, mutations
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tandem-weights")
        self._snapshot: Snapshot | None = None
        self._lock = asyncio.Lock()
        self._local = threading.local()  # each transfer thread's pinned host block
        self.groups: dict[str, WeightGroup] = {}  # receiver -> its group
        self.store_hosts = tuple(store_hosts)  # rendezvous hosts accepted besides the caller's (store_address.py)
        self._export: ExportBuffer | None = None  # kept across versions (same-host readers keep it open)
        self._writes = itertools.count(1)  # stamps of the export buffer's writes
        self.placement = local_placement()

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def snapshot(self, version: int | None = None) -> Snapshot:
        """The current version's snapshot (exported now if it is not the one kept); `version`,
        when given, must be the current one."""
        async with self._lock:
            snap = self._snapshot
            if snap is None or snap.epoch != self._mutations():
                self._snapshot = snap = None  # the old copy goes first: its memory may be needed
                device.ipc_collect()
                current, epoch, weights = await self._run_model(self._take)
                snap = await self._run_model(self._snapshot_of, current, epoch, weights)
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

    # ---- shared export buffer (CUDA IPC / CPU shared memory) ----------------------------
    def _buffer_for(self, total_bytes: int, dev: torch.device) -> ExportBuffer:
        """The export buffer, kept while the layout's size and device stay (a new one: new id)."""
        buf = self._export
        if buf is None or buf.total_bytes != total_bytes or buf.buffer.device != dev:
            self._export = buf = None  # the old one first: its memory may be needed
            device.ipc_collect()
            self._export = buf = ExportBuffer(total_bytes, dev)
        return buf

    def _snapshot_of(self, version: int, epoch: int, weights: dict) -> Snapshot:
        """On a GPU the export buffer written with the version (seqlock stamp); on CPU the
        tensors as they are (copied into a shared buffer only when a reader asks: `share`)."""
        manifest = Manifest.of(version, weights)
        tensors = [t.contiguous() for t in weights.values()]
        if not tensors or tensors[0].device.type == "cpu":
            return Snapshot(manifest, tensors, epoch)
        buf = self._buffer_for(manifest.total_bytes, tensors[0].device)
        copies = views(buf.flat, manifest)
        stamp = next(self._writes)
        buf.write(copies, tensors, stamp)
        return Snapshot(manifest, copies, epoch, buf.flat, buf, stamp)

    async def share(self, version: int, known_buffer: str = "", known_layout: str = "") -> ShareReply:
        """The version in the export buffer; its handle only if `known_buffer` is not that
        buffer, the manifest only if `known_layout` is not its layout."""
        snap = await self.snapshot(version)
        if snap.export is None:  # CPU: write the live tensors into the shared buffer once per snapshot
            async with self._lock:
                if snap.export is None:
                    await self._run(self._share_on_host, snap)
        buf, m = snap.export, snap.manifest
        fresh = known_buffer != buf.buffer_id
        fields = await self._run(buf.handle) if fresh else {}  # GPU: computed once per buffer, then cached
        return ShareReply(m.version, buf.buffer_id, buf.size, m.total_bytes, snap.stamp, buf.word_sum,
                          m.fingerprint, self.placement.device_uuid, None if known_layout == m.fingerprint else m,
                          fields, buf.shm_path if fresh else "")

    def _share_on_host(self, snap: Snapshot) -> None:
        buf = self._buffer_for(snap.manifest.total_bytes, torch.device("cpu"))
        stamp = next(self._writes)
        buf.write(views(buf.flat, snap.manifest), snap.tensors, stamp)
        try:
            self.check_intact(snap)  # the CPU snapshot is the live parameters: an update may have torn the copy
        except Aborted:
            buf.invalidate()
            raise
        snap.export, snap.stamp = buf, stamp

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
