"""Helpers of the weight-plane tests (tests/ is on sys.path through its conftest.py): the actor
export's per-tensor digests read from its own stream, and an in-process ActorService that
serves weights the way a test wants (a bad stream, or a real actor's stream cut mid-way)."""
import asyncio
import hashlib
import os
import tempfile

import numpy as np

from tandem.weights import wire
from tandem.weights.client import WeightSourceClient


async def read_export(endpoint: str, chunk_bytes: int = 1 << 16) -> tuple:
    """(manifest, [(name, tensor bytes)]) of the actor's current export, from StreamWeights."""
    client = WeightSourceClient(endpoint, timeout_s=120)
    manifest, _ = await client.manifest()
    flat = bytearray(manifest.total_bytes)
    async for msg in client.stream(manifest.version, chunk_bytes):
        if msg[0] == "chunk":
            flat[msg[1]: msg[1] + len(msg[2])] = msg[2]
    await client.close()
    return manifest, [(t.name, bytes(flat[t.offset: t.offset + t.nbytes])) for t in manifest.tensors]


async def export_digest(endpoint: str) -> tuple[int, dict[str, str]]:
    manifest, tensors = await read_export(endpoint)
    return manifest.version, {name: hashlib.sha256(data).hexdigest() for name, data in tensors}


class FakeSource:
    """ActorService's weight RPCs answering from `messages(version, chunk_bytes)` (an async
    generator of stream messages) with a fixed manifest; `calls` counts StreamWeights calls."""

    def __init__(self, manifest, placement, messages):
        self.manifest, self.placement, self.messages, self.calls = manifest, placement, messages, 0

    async def GetWeightsManifest(self, request, context):
        return wire.weights_pb2.GetWeightsManifestResponse(manifest=wire.manifest_to_pb(self.manifest),
                                                           placement=wire.placement_to_pb(self.placement))

    async def StreamWeights(self, request, context):
        self.calls += 1
        async for m in self.messages(request.weights_version, request.chunk_bytes):
            yield m


async def serve_in_background(servicer) -> tuple[str, asyncio.Task]:
    """Serve `servicer` as tandem.v1.ActorService on a free port: -> (endpoint, task to cancel)."""
    from tandem.rpc.server import serve

    port_file = os.path.join(tempfile.mkdtemp(prefix="fake-source-"), "port")
    task = asyncio.ensure_future(serve([("tandem.v1.ActorService", servicer)], role="fake-actor",
                                       port_file=port_file, grace_s=0.1))
    while not os.path.exists(port_file):
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    with open(port_file) as f:
        return f"127.0.0.1:{int(f.read())}", task


def chunks_of(data: bytes, chunk_bytes: int):
    """(offset, piece) of a flat layout's bytes in chunk_bytes pieces."""
    return [(a, data[a: a + chunk_bytes]) for a in range(0, len(data), chunk_bytes)]


def flat_bytes(manifest, tensors: list) -> bytes:
    """The flat layout of a manifest from its tensors' bytes (padding zeros)."""
    flat = np.zeros(manifest.total_bytes, dtype=np.uint8)
    for spec, (_, data) in zip(manifest.tensors, tensors):
        flat[spec.offset: spec.offset + spec.nbytes] = np.frombuffer(data, dtype=np.uint8)
    return flat.tobytes()


class KillingProxy:
    """An ActorService in front of a real actor: forwards GetWeightsManifest, and StreamWeights
    in small chunks (its own flow-control window kept small, so the actor cannot have sent the
    whole version ahead), killing the actor with `kill()` after `after` chunks; the stream then
    fails as a dead actor's does. `upstream_error` records how the actor's stream ended."""

    def __init__(self, target: str, after: int, kill, chunk_bytes: int = 1024):
        self.target, self.after, self.kill, self.chunk_bytes = target, after, kill, chunk_bytes
        self.upstream_error = None

    async def GetWeightsManifest(self, request, context):
        client = WeightSourceClient(self.target, timeout_s=60)
        try:
            return await client.call("GetWeightsManifest", request)
        finally:
            await client.close()

    async def StreamWeights(self, request, context):
        import grpc

        request.chunk_bytes = min(request.chunk_bytes, self.chunk_bytes)
        channel = grpc.aio.insecure_channel(self.target, options=[("grpc.http2.bdp_probe", 0)])
        call = channel.unary_stream("/tandem.v1.ActorService/StreamWeights",
                                    request_serializer=type(request).SerializeToString, response_deserializer=None)
        sent = 0
        try:
            async for data in call(request, timeout=60):
                yield data
                sent += 1
                if sent == self.after:
                    await asyncio.get_running_loop().run_in_executor(None, self.kill)
        except grpc.aio.AioRpcError as e:
            self.upstream_error = e
            from tandem.rpc.errors import error_from_rpc

            raise error_from_rpc(e, "ActorService.StreamWeights") from None
        finally:
            await channel.close()
