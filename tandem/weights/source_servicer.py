"""ActorService's weight-plane RPCs (weights.proto) over a WeightSource: decode, check, call,
encode. The actor's servicer inherits them; `self.weights` is its WeightSource."""
from __future__ import annotations

import asyncio

from tandem.rpc.errors import InvalidArgument
from tandem.v1 import weights_pb2
from tandem.weights import wire
from tandem.weights.group import MAX_GROUP_TIMEOUT_S
from tandem.weights.source import WeightSource
from tandem.weights.store_address import store_problem

MAX_CHUNK_BYTES = 256 << 20  # a chunk message stays well under the 512 MiB gRPC message limit


def _version(request) -> int:
    """The request's weights_version, which a source only ever numbers from 0."""
    if request.weights_version < 0:
        raise InvalidArgument(f"weights_version: {request.weights_version} must be >= 0")
    return request.weights_version


class WeightSourceServicer:
    weights: WeightSource

    async def GetWeightsManifest(self, request, context):
        snap = await self.weights.snapshot()
        return weights_pb2.GetWeightsManifestResponse(manifest=wire.manifest_to_pb(snap.manifest),
                                                      placement=wire.placement_to_pb(self.weights.placement))

    async def StreamWeights(self, request, context):
        if not 0 < request.chunk_bytes <= MAX_CHUNK_BYTES:
            raise InvalidArgument(f"chunk_bytes: {request.chunk_bytes} must be in 1..{MAX_CHUNK_BYTES}")
        async for message in self.weights.stream(_version(request), request.chunk_bytes, request.start,
                                                 request.end):
            yield message

    async def ShareWeights(self, request, context):
        reply = await self.weights.share(_version(request), request.known_buffer, request.known_layout)
        return wire.share_to_pb(reply)

    async def ReleaseWeights(self, request, context):
        await self.weights.release(_version(request))
        return weights_pb2.ReleaseWeightsResponse()

    async def JoinWeightGroup(self, request, context):
        r = request
        if not r.group_id or not r.receiver or not r.store_host:
            raise InvalidArgument("group_id, receiver and store_host must be set")
        if not 0 < r.store_port < 65536 or r.world_size < 2:
            raise InvalidArgument(f"store_port {r.store_port} (1..65535), world_size {r.world_size} (>= 2)")
        if not 0 < r.timeout_s <= MAX_GROUP_TIMEOUT_S:
            raise InvalidArgument(f"timeout_s: {r.timeout_s} must be in (0, {MAX_GROUP_TIMEOUT_S:g}] seconds")
        if r.backend not in ("nccl", "gloo"):
            raise InvalidArgument(f"backend: {r.backend!r}; known: ['gloo', 'nccl']")
        why = await asyncio.get_running_loop().run_in_executor(
            None, store_problem, r.store_host, context.peer() or "", self.weights.store_hosts)
        if why:
            raise InvalidArgument(f"store_host: {why}")
        await self.weights.join(r.group_id, r.receiver, r.store_host, r.store_port, r.world_size, r.backend,
                                r.timeout_s)
        return weights_pb2.JoinWeightGroupResponse()

    async def BroadcastWeights(self, request, context):
        if request.bucket_bytes <= 0:
            raise InvalidArgument(f"bucket_bytes: {request.bucket_bytes} must be > 0")
        async for kind, value in self.weights.broadcast(request.group_id, _version(request),
                                                        request.bucket_bytes):
            if kind == "ready":
                yield weights_pb2.BroadcastWeightsResponse(ready=wire.manifest_to_pb(value))
            else:
                yield weights_pb2.BroadcastWeightsResponse(done_bytes=value)
