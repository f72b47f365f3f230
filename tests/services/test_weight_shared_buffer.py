"""The same-host transport end to end between real processes on CPU (`ipc` over a shared-memory
file: the protocol a GPU runs, tandem/weights/shared.py): the rollout keeps the actor's export
buffer mapped across versions (one ShareWeights call per sync), maps it again when the buffer
changes (another actor), and a sync whose buffer was rewritten with a newer version before the
rollout's copy ends ABORTED with the old weights serving. Also: a JoinWeightGroup with a timeout
above the cap or a store the actor does not accept is INVALID_ARGUMENT and the actor keeps serving."""
import asyncio

import grpc
from test_weight_faults import REPLICA, assert_unchanged, baseline, own_actor  # noqa: F401 (a fixture)
from weight_plane import export_digest, serve_in_background

from tandem.weights.client import WeightSourceClient

INVALID = grpc.StatusCode.INVALID_ARGUMENT


class RewritingProxy:
    """An ActorService in front of a real actor that, after forwarding ShareWeights, has the actor
    export a newer version into the same buffer (an update, then another reader's ShareWeights)
    before answering: the rollout then copies a buffer that no longer holds the version it was told."""

    def __init__(self, target: str, update):
        self.target, self.update = target, update

    async def GetWeightsManifest(self, request, context):
        client = WeightSourceClient(self.target, timeout_s=60)
        try:
            return await client.call("GetWeightsManifest", request)
        finally:
            await client.close()

    async def ShareWeights(self, request, context):
        from tandem.v1 import weights_pb2

        client = WeightSourceClient(self.target, timeout_s=120)
        try:
            reply = await client.call("ShareWeights", request)
            newer = await self.update()
            await client.call("ShareWeights", weights_pb2.ShareWeightsRequest(weights_version=newer))
            return reply
        finally:
            await client.close()


def test_ipc_keeps_the_buffer_mapped_reopens_a_new_one_and_refuses_a_rewritten_one(services, own_actor):
    from test_rollout_standalone import sft_batch

    from tandem.controller.clients import ActorClient

    async def main():
        rollout = services.client("rollout", REPLICA)
        _, endpoint = await own_actor("actor")
        actor = ActorClient(endpoint, timeout_s=120)
        await actor.train_sft(sft_batch(services))
        v1 = await actor.weights_version()
        first = await rollout.sync_weights(v1, endpoint, transport="ipc", force=True)
        assert first.buffer_opened and first.weights_version == v1 and first.bytes > 0
        assert await rollout.weights_digest() == await export_digest(endpoint)

        await actor.train_sft(sft_batch(services))
        v2 = await actor.weights_version()
        second = await rollout.sync_weights(v2, endpoint)  # the configured choice (auto): ipc again, by the cache
        assert not second.buffer_opened and second.weights_version == v2
        phases = set(second.breakdown)
        assert phases >= {"rpc", "open", "copy", "check", "commit"} and "manifest" not in phases  # one RPC
        digest = await rollout.weights_digest()
        assert digest == await export_digest(endpoint) and digest[1] != (await export_digest(services.source()))[1]

        session_version = (await export_digest(services.source()))[0]
        other = await rollout.sync_weights(session_version, services.source(), transport="ipc", force=True)
        assert other.buffer_opened  # another actor: another buffer
        back = await rollout.sync_weights(v2, endpoint, transport="ipc", force=True)
        assert back.buffer_opened and await rollout.weights_digest() == digest

        gen = await rollout.generate_sequences(services.prompts(), max_new_tokens=6, greedy=True)

        async def update():
            await actor.train_sft(sft_batch(services))
            return await actor.weights_version()
        proxy_endpoint, task = await serve_in_background(RewritingProxy(endpoint, update))
        try:
            # the proxy shares v2, then the actor exports v3 into the same buffer before the rollout copies
            await services.expect_error(rollout.sync_weights(v2, proxy_endpoint, transport="ipc", force=True),
                                        grpc.StatusCode.ABORTED, "SyncWeights", "rewritten", f"version {v2} had")
        finally:
            task.cancel()
        await assert_unchanged(services, rollout, v2, gen, digest, "a sync of a rewritten buffer")
        v4 = await actor.weights_version()
        reply = await rollout.sync_weights(v4, endpoint)
        assert reply.weights_version == v4 and not reply.buffer_opened
        assert await rollout.weights_digest() == await export_digest(endpoint)
        await baseline(services, rollout)
        for c in (rollout, actor):
            await c.close()

    asyncio.run(main())


def test_join_weight_group_refuses_a_long_timeout_and_a_foreign_store(services):
    async def main():
        source = WeightSourceClient(services.source(), timeout_s=60)
        good = dict(group_id="g", receiver="test", host="127.0.0.1", port=29999, size=2, backend="gloo", timeout_s=5.0)
        cases = [(dict(timeout_s=1e9), ("timeout_s", "600")),
                 (dict(timeout_s=0.0), ("timeout_s",)),
                 (dict(host="http://127.0.0.1"), ("store_host", "not a host name")),
                 (dict(host="127.0.0.1:29999"), ("store_host", "not a host name")),
                 (dict(host="192.0.2.7"), ("store_host", "not the caller's address"))]
        for change, fragments in cases:
            await services.expect_error(source.join(**dict(good, **change)), INVALID, "JoinWeightGroup", *fragments)
        manifest, _ = await source.manifest()  # still serving
        rollout = services.client("rollout", REPLICA)
        reply = await rollout.sync_weights(manifest.version, services.source(), transport="collective", force=True)
        assert reply.weights_version == manifest.version
        assert await rollout.weights_digest() == await export_digest(services.source())
        for c in (source, rollout):
            await c.close()

    asyncio.run(main())
