"""The rollout front's SyncWeights: pull a version from its source, check it, swap atomically.

One sync at a time: (1) the version order (older than the rollout's: FAILED_PRECONDITION;
equal: nothing to do, unless forced), (2) the source's manifest checked tensor by tensor
against this model's own TP=1 layout (INVALID_ARGUMENT naming the tensor), (3) the transport
(tandem/weights/transport.py: configured, or picked from where the source and every rank
run), (4) the bytes into every rank's staging buffer, each transport checking what it can
(stream: offsets, sizes, the end message; IPC: the shared buffer's seqlock stamp and a word
sum, tandem/weights/shared.py; collective: the source's confirmation that its copy stayed that
version throughout), (5) the commit on every rank. A rollout that synced by IPC from a source
skips (1)'s manifest and (3) on the next sync from it: one ShareWeights call, no manifest unless
the layout changed, no handle unless the source's buffer changed. A failure
anywhere before (5) leaves the old weights serving and the error is the RPC's status.

Rank-group calls (placement, IPC copies, broadcasts, the commit) run on the worker thread,
so they never interleave with a generation's commands; stream chunks are received on the
event loop into the front's buffer while generation goes on.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from tandem.logging import get_logger
from tandem.rpc.errors import Aborted, FailedPrecondition, Internal, InvalidArgument, Unavailable
from tandem.weights import streams
from tandem.weights import transport as T
from tandem.weights.client import WeightSourceClient
from tandem.weights.group import MAX_GROUP_TIMEOUT_S, WeightGroup
from tandem.weights.layout import Manifest

log = get_logger("tandem.weights.receiver")


@dataclass(frozen=True)
class SyncResult:
    version: int
    transport: str | None  # None: nothing moved (already at that version)
    bytes: int
    seconds: float  # the whole sync
    transfer_seconds: float = 0.0  # moving the bytes into the staging buffers
    breakdown: dict = field(default_factory=dict)  # seconds per phase (ipc: rpc, open, copy, check, commit)
    opened: bool = False  # ipc: the source's shared buffer was (re)opened


class WeightReceiver:
    """cfg: tandem.config.WeightSyncConfig; host: the address this rollout serves on (a weight
    group's rendezvous store listens there); security: the source's (the actor's) TLS and token,
    tandem.rpc.security.EndpointSecurity, None for plaintext."""

    def __init__(self, group, staging, thread, cfg, host: str, security=None):
        self.group, self.staging, self.thread, self.cfg = group, staging, thread, cfg
        self.host = T.advertised_host(host)
        self.name = f"{self.host}/{uuid.uuid4().hex[:12]}"  # this process, to the source (one group each)
        self.configured = T.CONFIG_VALUES[cfg.transport]
        self._lock = asyncio.Lock()
        self._clients: dict[str, WeightSourceClient] = {}
        self.security = security
        self._stream_channels = streams.Channels(security)
        self._placements: list[T.Placement] | None = None
        self._store = None  # the weight group's rendezvous store (hosted here)
        self._group: tuple[str, str] | None = None  # (group id, source) of the current weight group
        # ipc: the source last synced by ipc and its GPU (its next sync skips the manifest and the
        # transport choice: one ShareWeights call), the buffer every rank has mapped, the layout checked
        self._ipc_source: tuple[str, str] | None = None
        self._known_buffer, self._known_layout = "", ""

    @property
    def version(self) -> int:
        return self.staging.worker.weights_version

    async def _ranks(self, method: str, *args) -> list:
        return await self.thread.run(self.group.run_ranks, "weights", method, [args] * self.group.world)

    def _client(self, source: str) -> WeightSourceClient:
        if source not in self._clients:
            self._clients[source] = WeightSourceClient(source, timeout_s=self.cfg.timeout_s, security=self.security)
        return self._clients[source]

    async def sync(self, version: int, source: str, requested: str | None, force: bool) -> SyncResult:
        async with self._lock:
            t0 = time.perf_counter()
            if version < self.version and not force:
                raise FailedPrecondition(f"weights_version {version} is older than the rollout's {self.version} "
                                         "(force=true accepts it: a run restarting from an earlier checkpoint)")
            if version == self.version and not force:
                return SyncResult(version, None, 0, 0.0)
            client = self._client(source)
            info: dict = {}
            cached = self._ipc_source  # the last sync from this source went by ipc: skip the manifest
            if cached is not None and cached[0] == source and (requested or self.configured) in (None, T.IPC):
                kind, moved = T.IPC, await self._ipc(client, version, cached[1], info)
            else:
                kind, moved = await self._pick_and_move(client, version, source, requested, info)
            t1 = time.perf_counter()
            await self._ranks("commit", version, kind == T.STREAM)
            info["commit"] = time.perf_counter() - t1
            seconds = time.perf_counter() - t0
            transfer = info.pop("transfer", sum(info.get(k, 0.0) for k in ("rpc", "open", "copy", "check")))
            opened = bool(info.pop("opened", False))
            log.info("weights.synced", version=version, transport=kind, bytes=moved, seconds=round(seconds, 4),
                     transfer_s=round(transfer, 4), gbps=round(moved / seconds / 1e9, 3), opened=opened,
                     **{f"{k}_s": round(v, 5) for k, v in info.items()})
            return SyncResult(version, kind, moved, seconds, transfer, info, opened)

    async def _pick_and_move(self, client, version: int, source: str, requested, info: dict) -> tuple[str, int]:
        """The general path: the manifest and placement, the transport, the transfer."""
        t0 = time.perf_counter()
        manifest, placement = await client.manifest()
        if manifest.version != version:
            raise FailedPrecondition(f"weights_version {version}: the source {source} is at version "
                                     f"{manifest.version}")
        self._check(manifest, "the source's manifest")
        if self._placements is None:
            self._placements = await self._ranks("placement")
        kind = T.pick(requested or self.configured, placement, self._placements)
        why = T.problem(kind, placement, self._placements)
        if why:
            raise FailedPrecondition(f"transport {kind}: {why}")
        info["manifest"] = time.perf_counter() - t0
        if kind == T.IPC:
            moved = await self._ipc(client, version, placement.device_uuid, info)
            self._ipc_source = (source, placement.device_uuid)
            return kind, moved
        self._ipc_source = None
        move = {T.STREAM: self._stream, T.COLLECTIVE: self._collective}[kind]
        t1 = time.perf_counter()
        moved = await move(client, manifest, placement, source)
        info["transfer"] = time.perf_counter() - t1
        return kind, moved

    def _check(self, manifest: Manifest, what: str) -> None:
        problem = manifest.mismatch(self.staging.expected)
        if problem:
            raise InvalidArgument(f"{what}: {problem}")

    # ---- stream ----------------------------------------------------------------------------
    async def _stream(self, client, manifest: Manifest, placement, source) -> int:
        chunk = max(1, int(self.cfg.chunk_mb * (1 << 20)))
        channels = self._stream_channels.get(source, self.cfg.streams)
        return await asyncio.get_running_loop().run_in_executor(
            None, streams.receive, channels, manifest, chunk, self.staging.writer, self._check, self.cfg.timeout_s)

    # ---- shared buffer (CUDA IPC; shared memory on a CPU host) -------------------------------
    async def _ipc(self, client, version: int, device_uuid: str, info: dict) -> int:
        """One ShareWeights call (the handle and the manifest only when new to this rollout),
        every rank's copy from the mapped buffer and its checks (tandem/weights/shared.py).
        Any failure forgets what was cached: the next sync takes the general path."""
        try:
            t0 = time.perf_counter()
            reply = await client.share(version, self._known_buffer, self._known_layout)
            info["rpc"] = time.perf_counter() - t0
            if reply.weights_version != version:
                raise FailedPrecondition(f"ShareWeights answered version {reply.weights_version}, not {version}")
            if reply.device_uuid != device_uuid:
                raise FailedPrecondition(f"ipc: the source now runs on GPU {reply.device_uuid!r}, not "
                                         f"{device_uuid!r} (restarted elsewhere?); sync again")
            if reply.manifest is not None:
                self._check(reply.manifest, "ShareWeights")
                self._known_layout = reply.manifest.fingerprint
            elif reply.layout != self._known_layout:
                raise InvalidArgument(f"ShareWeights: layout {reply.layout!r} without its manifest")
            results = await self._ranks("receive_shared", reply)
            self._known_buffer = reply.buffer_id
        except BaseException:
            self._ipc_source, self._known_buffer = None, ""
            raise
        for k in ("open", "copy", "check"):
            info[k] = max(r[k] for r in results)
        info["opened"] = any(r["opened"] for r in results)
        problems = [f"rank {i}: {r['problem']}" for i, r in enumerate(results) if r["problem"]]
        if problems:
            raise Aborted("ipc: " + "; ".join(problems))
        return reply.total_bytes

    # ---- collective --------------------------------------------------------------------------
    async def _collective(self, client, manifest: Manifest, placement, source) -> int:
        for attempt in (0, 1):
            if self._group is None or self._group[1] != source:
                await self._join(client, placement, source)
            try:
                return await self._broadcast(client, manifest)
            except FailedPrecondition as e:
                if attempt or "unknown here" not in str(e):
                    raise
                self._group = None  # the source restarted: join again, once
        raise AssertionError("unreachable")

    async def _join(self, client, placement, source: str) -> None:
        await self._ranks("leave")
        self._group = None
        size, backend, host = 1 + self.group.world, T.backend(placement), self.host
        timeout = min(self.cfg.timeout_s, MAX_GROUP_TIMEOUT_S)  # the source refuses longer
        self._store, port = WeightGroup.host_store(host, size, timeout)
        group_id = uuid.uuid4().hex
        await asyncio.gather(client.join(group_id, self.name, host, port, size, backend, timeout),
                             self._ranks("join", group_id, host, port, size, backend, timeout))
        self._group = (group_id, source)
        log.info("weights.group_joined", group=group_id, source=source, size=size, backend=backend)

    async def _broadcast(self, client, manifest: Manifest) -> int:
        bucket, group_id = self.cfg.bucket_mb << 20, self._group[0]
        replies = client.broadcast(group_id, manifest.version, bucket).__aiter__()
        kind, ready = await replies.__anext__()  # a refused request fails here: nothing posted yet
        if kind != "ready":
            raise Internal(f"BroadcastWeights: {kind} before ready")
        self._check(ready, "BroadcastWeights")
        receiving = asyncio.ensure_future(self._ranks("receive_broadcast", bucket))
        try:
            kind, sent = await replies.__anext__()
        except BaseException:
            await asyncio.gather(receiving, return_exceptions=True)  # the ranks fail too (peer gone)
            self._group = None
            raise
        try:
            await receiving
        except RuntimeError as e:  # a rank's broadcast failed although the source finished
            self._group = None
            raise Unavailable(f"weight group {group_id}: receiving failed: {e}") from None
        return sent

    # ---- digest ------------------------------------------------------------------------------
    async def digest(self) -> tuple[int, dict[str, str]]:
        """(version, per-tensor SHA-256 of the TP=1 weights); every rank must hold the same."""
        async with self._lock:
            digests = await self._ranks("digest")
        for rank, d in enumerate(digests):
            if d != digests[0]:
                bad = sorted(k for k in d if d[k] != digests[0].get(k))
                raise Internal(f"rank {rank}'s weights differ from rank 0's: {bad[:5]}")
        return self.version, digests[0]
