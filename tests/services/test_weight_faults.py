"""A sync that fails leaves the rollout serving its old weights, and the next one works: a
stream with a bad name or size (INVALID_ARGUMENT), and an actor killed with SIGKILL in the
middle of a sync, replaced by a new actor process resumed from its checkpoint."""
import asyncio
import os
from dataclasses import replace

import grpc
import pytest
import torch
from weight_plane import (
    FakeSource,
    KillingProxy,
    chunks_of,
    export_digest,
    flat_bytes,
    read_export,
    serve_in_background,
)

from tandem.weights import wire
from tandem.weights.layout import Manifest
from tandem.weights.transport import local_placement

GREEDY = dict(max_new_tokens=6, greedy=True)
INVALID = grpc.StatusCode.INVALID_ARGUMENT
REPLICA = "rollout-1"  # the fault tests use the second replica (the other tests' rows stay put)


async def baseline(services, rollout):
    """Force the replica to the session actor's weights: -> (version, generation, digest)."""
    actor = services.client("actor")
    version = await actor.weights_version()
    await actor.close()
    await rollout.sync_weights(version, services.source(), force=True)
    gen = await rollout.generate_sequences(services.prompts(), **GREEDY)
    return version, gen, await rollout.weights_digest()


async def assert_unchanged(services, rollout, version, gen, digest, what):
    again = await rollout.generate_sequences(services.prompts(), **GREEDY)
    for k in ("responses", "rollout_log_probs"):
        assert torch.equal(again[k], gen[k]), f"{k} changed after {what}"
    assert again.meta["weights_version"] == version, what
    assert await rollout.weights_digest() == digest, what


def bad_streams(manifest: Manifest, flat: bytes):
    """(what, manifest served by GetWeightsManifest, stream messages, message fragments)."""
    v = manifest.version
    renamed = Manifest(v, (replace(manifest.tensors[0], name="decoder.bogus.weight"), *manifest.tensors[1:]),
                       manifest.total_bytes)

    def stream(first=manifest, chunk=4096, drop_end=False, end_total=None, skip=None, oversize=False):
        async def messages(version, chunk_bytes):
            yield wire.manifest_message(first)
            for i, (a, piece) in enumerate(chunks_of(flat + (bytes(8) if oversize else b""), chunk)):
                if i != skip:
                    yield wire.chunk_message(a, [piece])
            if not drop_end:
                yield wire.end_message(v, end_total if end_total is not None else len(flat))
        return messages

    return [
        ("a renamed tensor in the manifest", renamed, stream(), ("decoder.bogus.weight",)),
        ("a renamed tensor in the stream", manifest, stream(first=renamed), ("weights stream", "decoder.bogus.weight")),
        ("a chunk past the layout's end", manifest, stream(oversize=True), ("a chunk of", "-byte layout")),
        ("a missing chunk", manifest, stream(skip=1), ("a chunk at byte 8192, expected 4096",)),
        ("no end message", manifest, stream(drop_end=True), ("without its end message",)),
        ("a wrong total in the end", manifest, stream(end_total=7), ("7 bytes",)),
    ]


def test_bad_stream_is_invalid_and_keeps_the_old_weights(services):
    async def main():
        rollout = services.client("rollout", REPLICA)
        version, gen, digest = await baseline(services, rollout)
        exported, tensors = await read_export(services.source())
        real = exported.with_version(version + 1)
        flat = flat_bytes(real, tensors)
        for what, served, messages, frags in bad_streams(real, flat):
            endpoint, task = await serve_in_background(FakeSource(served, local_placement(), messages))
            try:
                await services.expect_error(rollout.sync_weights(version + 1, endpoint, transport="stream"),
                                            INVALID, "SyncWeights", *frags)
            finally:
                task.cancel()
            await assert_unchanged(services, rollout, version, gen, digest, what)
        # the fake source is faithful: a good stream of the same bytes is taken
        endpoint, task = await serve_in_background(FakeSource(real, local_placement(), _good(real, flat)))
        try:
            assert (await rollout.sync_weights(version + 1, endpoint)).weights_version == version + 1
        finally:
            task.cancel()
        assert await rollout.weights_digest() == (version + 1, digest[1])  # the same bytes, as version + 1
        await baseline(services, rollout)
        await rollout.close()

    asyncio.run(main())


def _good(manifest, flat):
    async def messages(version, chunk_bytes):
        yield wire.manifest_message(manifest)
        for a, piece in chunks_of(flat, chunk_bytes):
            yield wire.chunk_message(a, [piece])
        yield wire.end_message(manifest.version, len(flat))
    return messages


@pytest.fixture
def own_actor(services, tmp_path):
    """await start(name) -> (launcher, endpoint): an actor service of the session's model (one
    rank, standalone mode) in its own process; every one started is stopped at the end."""
    from tandem.config import load_config, to_yaml
    from tandem.controller.launchers import LaunchContext
    from tandem.controller.launchers.local import LocalLauncher

    cfg = load_config(os.path.join(services.run_dir, "config_standalone.yaml"), ["services.actor.world_size=1"])
    path = tmp_path / "actor.yaml"
    path.write_text(to_yaml(cfg))
    started = []

    async def start(name: str) -> tuple[LocalLauncher, str]:
        launcher = LocalLauncher(LaunchContext(str(path), str(tmp_path), services.run_id, startup_timeout_s=180))
        started.append(launcher)
        endpoints = await launcher.start([name])
        return launcher, endpoints[name]
    yield start
    for launcher in started:
        launcher.stop()


def test_actor_killed_mid_sync_keeps_old_weights_and_a_new_actor_syncs(services, own_actor, tmp_path):
    from test_rollout_standalone import sft_batch

    from tandem.controller.clients import ActorClient

    async def main():
        rollout = services.client("rollout", REPLICA)
        first, first_endpoint = await own_actor("actor")
        actor = ActorClient(first_endpoint, timeout_s=120)
        await actor.train_sft(sft_batch(services))
        v1 = await actor.weights_version()
        await rollout.sync_weights(v1, first_endpoint, force=True)
        gen = await rollout.generate_sequences(services.prompts(), **GREEDY)
        digest = await rollout.weights_digest()
        assert digest == await export_digest(first_endpoint) and digest[0] == v1

        await actor.train_sft(sft_batch(services))
        ckpt = await actor.save_checkpoint(str(tmp_path / "ckpt"))
        v2 = await actor.weights_version()
        proc = first.processes["actor"]
        proxy = KillingProxy(first_endpoint, after=5, kill=lambda: (proc.kill(), proc.wait()))  # SIGKILL
        endpoint, task = await serve_in_background(proxy)
        try:
            await services.expect_error(rollout.sync_weights(v2, endpoint), grpc.StatusCode.UNAVAILABLE,
                                        "SyncWeights", "StreamWeights")
        finally:
            task.cancel()
        assert proxy.upstream_error is not None and first.processes["actor"].poll() is not None
        await assert_unchanged(services, rollout, v1, gen, digest, "the actor died mid-sync")

        second, second_endpoint = await own_actor("actor-2")  # a new actor, resumed from the checkpoint
        actor2 = ActorClient(second_endpoint, timeout_s=120)
        assert await actor2.load_checkpoint(ckpt) == v2
        reply = await rollout.sync_weights(v2, second_endpoint, transport="collective")
        assert reply.weights_version == v2
        assert await rollout.weights_digest() == await export_digest(second_endpoint)
        again = await rollout.generate_sequences(services.prompts(), **GREEDY)
        assert again.meta["weights_version"] == v2 and not torch.equal(again["rollout_log_probs"], gen["rollout_log_probs"])
        await baseline(services, rollout)
        for c in (rollout, actor, actor2):
            await c.close()

    asyncio.run(main())

