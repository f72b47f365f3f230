"""The actor side of the weight plane in-process (no gRPC): one export per version, a stream
whose chunks rebuild the flat layout, and the seqlock: a transfer that overlapped an update
ends ABORTED."""
import asyncio

import pytest
import torch

from tandem.rpc.errors import Aborted, FailedPrecondition
from tandem.weights import wire
from tandem.weights.layout import views
from tandem.weights.source import WeightSource


class FakeActor:
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.weights = {"a": torch.randn(300, 7, generator=g), "b": torch.randn(5, generator=g).bfloat16(),
                        "c": torch.randn(1000, generator=g)}
        self.version, self.mutations, self.takes = 4, 0, 0

    def take(self):
        self.takes += 1
        return self.version, self.mutations, dict(self.weights)

    def update(self):
        self.mutations += 1
        for t in self.weights.values():
            t.add_(1)
        self.version += 1


async def run_now(fn, *args):
    return fn(*args)


async def collect(source, version, chunk_bytes, during=None):
    """Stream messages parsed; `during()` runs after the first chunk."""
    out = []
    async for m in source.stream(version, chunk_bytes):
        parsed = wire.parse_stream_message(m if isinstance(m, bytes) else m.SerializeToString())
        out.append(parsed)
        if during is not None and parsed[0] == "chunk" and sum(p[0] == "chunk" for p in out) == 1:
            during()
    return out


def rebuild(messages):
    manifest = messages[0][1]
    flat = torch.zeros(manifest.total_bytes, dtype=torch.uint8)
    for m in messages[1:-1]:
        flat[m[1]: m[1] + len(m[2])] = torch.frombuffer(bytearray(m[2]), dtype=torch.uint8)
    return manifest, views(flat, manifest)


def test_stream_rebuilds_the_export_and_one_export_serves_every_reader():
    actor = FakeActor()
    source = WeightSource(actor.take, run_now, lambda: actor.mutations)

    async def main():
        for chunk in (100, 4096, 1 << 20):
            messages = await collect(source, 4, chunk)
            assert messages[-1] == ("end", 4, messages[0][1].total_bytes)
            assert all(0 < len(m[2]) <= chunk for m in messages[1:-1])
            manifest, tensors = rebuild(messages)
            assert [t.name for t in manifest.tensors] == ["a", "b", "c"] and manifest.version == 4
            assert all(torch.equal(x, y) for x, y in zip(tensors, actor.weights.values()))
        assert actor.takes == 1  # three readers, one export
        with pytest.raises(FailedPrecondition, match="at version 4"):
            await collect(source, 3, 100)

    asyncio.run(main())


def test_an_update_during_a_transfer_aborts_it():
    actor = FakeActor()
    source = WeightSource(actor.take, run_now, lambda: actor.mutations)

    async def main():
        with pytest.raises(Aborted, match="changed while it was read"):
            await collect(source, 4, 100, during=actor.update)
        messages = await collect(source, 5, 100)  # the next sync takes the new version
        assert actor.takes == 2 and messages[0][1].version == 5
        _, tensors = rebuild(messages)
        assert all(torch.equal(x, y) for x, y in zip(tensors, actor.weights.values()))
        snap = await source.snapshot(5)
        await source.release(5)  # nothing changed since: confirmed
        actor.update()
        with pytest.raises(Aborted):
            await source.release(5)
        assert snap.manifest.version == 5

    asyncio.run(main())
