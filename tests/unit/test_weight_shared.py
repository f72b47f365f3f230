"""The same-host transport's protocol on CPU (tandem/weights/shared.py; on CPU the shared buffer is
a shared-memory file, the rest is the code a GPU runs): the source keeps one export buffer across
versions and sends its handle and manifest only to a reader that lacks them; the reader keeps its
mapping while the buffer id holds and opens again when it changes; a copy of a buffer that was
rewritten after the share (a newer version exported for another reader) is refused by its stamp;
a wrong word sum is refused. Also: which store hosts JoinWeightGroup accepts."""
import asyncio
import os

import pytest
import torch
from test_weight_source import FakeActor, run_now

from tandem.weights import wire
from tandem.weights.layout import views
from tandem.weights.shared import SharedReader
from tandem.weights.source import WeightSource
from tandem.weights.store_address import host_problem, store_problem


def source_of(actor):
    return WeightSource(actor.take, run_now, lambda: actor.mutations)


def copied(reader, reply, manifest):
    dst = torch.empty(reply.total_bytes, dtype=torch.uint8)
    problem, _, _ = reader.copy_into(dst, reply)
    return problem, views(dst, manifest)


def roundtrip(reply):
    return wire.share_from_pb(wire.share_to_pb(reply))


def test_handle_and_manifest_only_when_new_and_the_mapping_is_kept():
    actor = FakeActor()
    source, reader = source_of(actor), SharedReader()

    async def main():
        first = roundtrip(await source.share(4))
        assert first.manifest is not None and first.shm_path and os.path.isfile(first.shm_path)
        manifest = first.manifest
        assert reader.open(first) is True
        problem, tensors = copied(reader, first, manifest)
        assert problem is None and all(torch.equal(x, y) for x, y in zip(tensors, actor.weights.values()))

        actor.update()  # version 5 goes into the same buffer under a new stamp
        second = roundtrip(await source.share(5, first.buffer_id, manifest.fingerprint))
        assert second.manifest is None and not second.shm_path and not second.fields  # nothing resent
        assert second.buffer_id == first.buffer_id and second.stamp > first.stamp
        assert second.layout == first.layout == manifest.fingerprint
        mapped = reader.buffer
        assert reader.open(second) is False and reader.buffer is mapped  # kept, not reopened
        problem, tensors = copied(reader, second, manifest)
        assert problem is None and all(torch.equal(x, y) for x, y in zip(tensors, actor.weights.values()))

        restarted = source_of(actor)  # a new source process: a new buffer, so its handle comes again
        third = roundtrip(await restarted.share(5, first.buffer_id, manifest.fingerprint))
        assert third.buffer_id != first.buffer_id and third.shm_path and third.manifest is None
        assert reader.open(third) is True and reader.buffer is not mapped
        assert copied(reader, third, manifest)[0] is None

    asyncio.run(main())


def test_a_buffer_rewritten_after_the_share_is_refused_and_a_bad_sum_too():
    actor = FakeActor()
    source, reader = source_of(actor), SharedReader()

    async def main():
        old = await source.share(4)
        reader.open(old)
        before = [t.clone() for t in actor.weights.values()]
        actor.update()
        await source.share(5, old.buffer_id, old.layout)  # another reader takes version 5: the buffer is rewritten
        problem, _ = copied(reader, old, old.manifest)
        assert problem is not None and "rewritten" in problem and f"version {old.weights_version}" in problem
        assert not all(torch.equal(x, y) for x, y in zip(before, actor.weights.values()))

        new = await source.share(5, old.buffer_id, old.layout)
        new.word_sum += 1  # what a corrupted copy would show
        problem, _ = copied(reader, new, old.manifest)
        assert problem is not None and "word sum" in problem
        new.word_sum -= 1
        assert copied(reader, new, old.manifest)[0] is None

    asyncio.run(main())


def test_reader_refuses_an_unknown_buffer_without_a_handle_and_a_bad_reply():
    actor = FakeActor()
    source, reader = source_of(actor), SharedReader()

    async def main():
        reply = await source.share(4, "someone-elses-buffer-id")
        reply.shm_path, reply.fields = "", {}
        with pytest.raises(ValueError, match="sent no handle"):
            reader.open(reply)
        pb = wire.share_to_pb(reply)
        pb.buffer_bytes = pb.total_bytes  # no room for the stamp
        from tandem.rpc.errors import InvalidArgument

        with pytest.raises(InvalidArgument, match="cannot hold"):
            wire.share_from_pb(pb)

    asyncio.run(main())


def test_store_hosts_the_source_accepts():
    assert host_problem("10.0.0.1") is None and host_problem("rollout-0.cluster.local") is None
    assert host_problem("[::1]") is None
    for bad in ("http://x", "host:123", "a b", "", "x/y"):
        assert host_problem(bad) is not None, bad
    assert store_problem("127.0.0.1", "ipv4:127.0.0.1:5000", ()) is None  # the caller's own address
    assert store_problem("localhost", "ipv4:127.0.0.1:5000", ()) is None  # this machine, caller local
    assert "not the caller's" in store_problem("192.0.2.7", "ipv4:127.0.0.1:5000", ())  # TEST-NET: not here
    assert "not the caller's" in store_problem("127.0.0.1", "ipv4:192.0.2.9:5000", ())  # a remote caller
    assert store_problem("192.0.2.7", "ipv4:127.0.0.1:5000", ("192.0.2.7",)) is None  # configured
    assert "does not resolve" in store_problem("no-such-host.invalid", "ipv4:127.0.0.1:1", ())
