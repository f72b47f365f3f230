"""Standalone rollout services (their own model copies) fed by the weight plane: each pulls the
actor's weights itself on SyncWeights (stream, or a gloo collective on CPU), swaps atomically,
refuses a wrong version order, and two replicas give the rows of one."""
import asyncio

import grpc
import torch
from weight_plane import export_digest

from tandem.data.batch import DataProto

INVALID, PRECONDITION = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
GREEDY = dict(max_new_tokens=6, greedy=True)
SAMPLED = dict(max_new_tokens=6, n=2, temperature=0.8, top_k=6, seed=17)


def sft_batch(services) -> DataProto:
    from tandem.controller.data import Example
    from tandem.controller.sft import sft_batch as build

    tok = services.tokenizer
    texts = ["12+7=", "905+88=", "3+4=", "640+521="]
    examples = [Example([tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"], t,
                        str(eval(t[:-1])), "tandem/arithmetic", {}) for t in texts]
    return build(examples, tok)


def assert_same_generation(a: DataProto, b: DataProto, what: str):
    for k in ("prompts", "responses", "response_mask", "input_ids", "attention_mask"):
        assert torch.equal(a[k], b[k]), f"{what}: {k} differs"
    # tokens must be identical; fp32 log-probs of shards batched differently (the colocated
    # rollout runs on the actor's DP ranks) sum in another order: observed up to 1.2e-5
    torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], atol=5e-5, rtol=0)


def test_sync_makes_standalone_match_colocated_bit_for_bit(services):
    async def main():
        actor = services.client("actor")
        colocated = services.client("rollout", "actor")
        standalone = services.client("rollout")
        prompts = services.prompts()
        await actor.train_sft(sft_batch(services))  # weights no standalone copy has seen
        want = await colocated.generate_sequences(prompts, **GREEDY)
        before = await standalone.generate_sequences(prompts, **GREEDY)
        assert not torch.allclose(before["rollout_log_probs"], want["rollout_log_probs"], atol=1e-4), \
            "standalone already matches the actor: the test would prove nothing"

        version = await actor.weights_version()
        reply = await standalone.sync_weights(version, services.source(), transport="stream")
        assert reply.weights_version == version and reply.bytes > 0 and reply.seconds > 0
        got = await standalone.generate_sequences(prompts, **GREEDY)
        assert_same_generation(got, want, "greedy")
        assert got.meta["weights_version"] == version
        assert_same_generation(await standalone.generate_sequences(prompts, **SAMPLED),
                               await colocated.generate_sequences(prompts, **SAMPLED), "sampled")
        # the rollout's parameters, gathered to TP=1 there, equal the actor's export bit for bit
        assert await standalone.weights_digest() == await export_digest(services.source())
        # the same version again moves nothing; forced, it moves it again (here over gloo)
        assert (await standalone.sync_weights(version, services.source())).bytes == 0
        again = await standalone.sync_weights(version, services.source(), transport="collective", force=True)
        assert again.bytes == reply.bytes and again.transport == 3  # WEIGHT_TRANSPORT_COLLECTIVE
        assert await standalone.weights_digest() == await export_digest(services.source())
        for c in (actor, colocated, standalone):
            await c.close()

    asyncio.run(main())


def test_collective_sync_after_update_and_version_order(services):
    async def main():
        actor = services.client("actor")
        colocated = services.client("rollout", "actor")
        standalone = services.client("rollout")
        prompts = services.prompts()
        old = await actor.weights_version()
        await standalone.sync_weights(old, services.source(), force=True)
        before = await standalone.generate_sequences(prompts, **GREEDY)
        await actor.train_sft(sft_batch(services))
        new = await actor.weights_version()
        assert new == old + 1

        # wrong order: older than the rollout's version, and a version the actor is not at
        await services.expect_error(standalone.sync_weights(old - 1, services.source()), PRECONDITION,
                                    "SyncWeights", f"{old - 1} is older")
        await services.expect_error(standalone.sync_weights(new + 5, services.source()), PRECONDITION,
                                    f"version {new + 5}", f"at version {new}")
        after = await standalone.generate_sequences(prompts, **GREEDY)
        assert_same_generation(after, before, "after refused syncs")
        assert after.meta["weights_version"] == old

        reply = await standalone.sync_weights(new, services.source(), transport="collective")
        assert reply.weights_version == new
        assert_same_generation(await standalone.generate_sequences(prompts, **GREEDY),
                               await colocated.generate_sequences(prompts, **GREEDY), "collective")
        for c in (actor, colocated, standalone):
            await c.close()

    asyncio.run(main())


def test_two_replicas_give_the_rows_of_one(services):
    from tandem.controller.rollout_replicas import RolloutReplicas
    from tandem.controller.weight_sync import sync_weights

    async def main():
        actor = services.client("actor")
        one = RolloutReplicas([services.client("rollout")], services.tokenizer.pad_token_id)
        two = RolloutReplicas([services.client("rollout"), services.client("rollout", "rollout-1")],
                              services.tokenizer.pad_token_id)
        metrics = await sync_weights(actor, two, force=True)
        assert metrics["weight_sync/bytes"] > 0 and metrics["rollout/weights_version"] == await actor.weights_version()
        one.expected_version = two.expected_version
        prompts = services.prompts(["12+7=", "905+88=", "3+4=", "640+521=", "1+1=", "77+7="])
        for kw in (SAMPLED, dict(GREEDY, n=1), dict(SAMPLED, n=3, seed=5)):
            a, b = await one.generate_sequences(prompts, **kw), await two.generate_sequences(prompts, **kw)
            for k in ("prompts", "responses", "response_mask", "input_ids", "attention_mask"):
                assert torch.equal(a[k], b[k]), (kw, k)
            torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], atol=1e-5, rtol=0)
        # a replica that serves another version fails the step
        two.expected_version += 1
        try:
            await two.generate_sequences(prompts, **SAMPLED)
            raise AssertionError("a stale replica went unnoticed")
        except RuntimeError as e:
            assert "generated with weights version" in str(e)
        for c in (actor, *one.clients, *two.clients):
            await c.close()

    asyncio.run(main())
