"""The receiver's client of a weight source (ActorService's weight-plane RPCs).

Streams are read as raw bytes and framed by tandem/weights/wire.py (zero-copy chunk data);
a failed call or stream raises the TandemError of its status, naming the RPC.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from tandem.rpc.client import ServiceClient
from tandem.rpc.errors import error_from_rpc
from tandem.v1 import actor_pb2_grpc, weights_pb2
from tandem.weights import wire
from tandem.weights.layout import Manifest
from tandem.weights.shared import ShareReply
from tandem.weights.transport import Placement


class WeightSourceClient(ServiceClient):
    def __init__(self, endpoint: str, timeout_s: float, security=None):
        kw = {"security": security} if security is not None else {}
        super().__init__(endpoint, actor_pb2_grpc.ActorServiceStub, timeout_s=timeout_s, **kw)

    async def _stream(self, method: str, request) -> AsyncIterator[bytes]:
        call = self.channel.unary_stream(f"/tandem.v1.ActorService/{method}",
                                         request_serializer=type(request).SerializeToString,
                                         response_deserializer=None)  # raw bytes
        try:
            async for data in call(request, timeout=self.timeout_s):
                yield data
        except grpc.aio.AioRpcError as e:
            raise error_from_rpc(e, f"ActorService.{method}") from None

    async def manifest(self) -> tuple[Manifest, Placement]:
        r = await self.call("GetWeightsManifest", weights_pb2.GetWeightsManifestRequest())
        return wire.manifest_from_pb(r.manifest), wire.placement_from_pb(r.placement)

    async def stream(self, version: int, chunk_bytes: int) -> AsyncIterator[tuple]:
        """Parsed messages: ("manifest", Manifest), ("chunk", offset, data view), ("end", version, bytes)."""
        request = weights_pb2.StreamWeightsRequest(weights_version=version, chunk_bytes=chunk_bytes)
        async for data in self._stream("StreamWeights", request):
            yield wire.parse_stream_message(data)

    async def share(self, version: int, known_buffer: str = "", known_layout: str = "") -> ShareReply:
        r = await self.call("ShareWeights", weights_pb2.ShareWeightsRequest(
            weights_version=version, known_buffer=known_buffer, known_layout=known_layout))
        return wire.share_from_pb(r)

    async def release(self, version: int) -> None:
        await self.call("ReleaseWeights", weights_pb2.ReleaseWeightsRequest(weights_version=version))

    async def join(self, group_id: str, receiver: str, host: str, port: int, size: int, backend: str,
                   timeout_s: float) -> None:
        await self.call("JoinWeightGroup", weights_pb2.JoinWeightGroupRequest(
            group_id=group_id, receiver=receiver, store_host=host, store_port=port, world_size=size,
            backend=backend, timeout_s=timeout_s))

    async def broadcast(self, group_id: str, version: int, bucket_bytes: int) -> AsyncIterator[tuple]:
        """("ready", Manifest), then ("done", bytes)."""
        request = weights_pb2.BroadcastWeightsRequest(group_id=group_id, weights_version=version,
                                                      bucket_bytes=bucket_bytes)
        async for data in self._stream("BroadcastWeights", request):
            msg = weights_pb2.BroadcastWeightsResponse.FromString(data)
            if msg.WhichOneof("kind") == "ready":
                yield "ready", wire.manifest_from_pb(msg.ready)
            else:
                yield "done", msg.done_bytes
