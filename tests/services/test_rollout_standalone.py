"""A standalone rollout service (its own model copy) fed by the actor's ExportWeights."""
import asyncio

import grpc
import torch

from tandem.data.batch import DataProto

INVALID = grpc.StatusCode.INVALID_ARGUMENT
GREEDY = dict(max_new_tokens=6, greedy=True)
SAMPLED = dict(max_new_tokens=6, n=2, temperature=0.8, top_k=6, seed=17)


def sft_batch(services) -> DataProto:
    from controller.data import Example
    from controller.sft import sft_batch as build

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


def test_load_weights_makes_standalone_match_colocated(services):
    async def main():
        actor = services.client("actor")
        colocated = services.client("rollout", "actor")
        standalone = services.client("rollout")
        prompts = services.prompts()
        # move the actor's weights away from anything the standalone copy has seen
        await actor.train_sft(sft_batch(services))
        want = await colocated.generate_sequences(prompts, **GREEDY)
        before = await standalone.generate_sequences(prompts, **GREEDY)
        assert not torch.allclose(before["rollout_log_probs"], want["rollout_log_probs"], atol=1e-4), \
            "standalone already matches the actor: the test would prove nothing"

        weights, version = await actor.export_weights()
        assert weights and all(not k.endswith("_extra_state") for k in weights)
        assert await standalone.load_weights(weights, version) == version
        got = await standalone.generate_sequences(prompts, **GREEDY)
        assert_same_generation(got, want, "greedy")
        assert got.meta["weights_version"] == version
        # sampling with a seed matches too: the whole distribution is the actor's
        assert_same_generation(await standalone.generate_sequences(prompts, **SAMPLED),
                               await colocated.generate_sequences(prompts, **SAMPLED), "sampled")
        for c in (actor, colocated, standalone):
            await c.close()

    asyncio.run(main())


def test_bad_load_weights_names_the_tensor_and_keeps_serving(services):
    async def main():
        actor = services.client("actor")
        colocated = services.client("rollout", "actor")
        standalone = services.client("rollout")
        prompts = services.prompts()
        weights, version = await actor.export_weights()
        assert await standalone.load_weights(weights, version) == version
        want = await colocated.generate_sequences(prompts, **GREEDY)
        assert_same_generation(await standalone.generate_sequences(prompts, **GREEDY), want, "loaded")
        # new actor weights that a failed load must not half-apply
        await actor.train_sft(sft_batch(services))
        new, new_version = await actor.export_weights()
        assert new_version > version

        name = sorted(k for k in new if "decoder.layers.0" in k and k.endswith("weight"))[0]
        wrong_shape = dict(new, **{name: torch.zeros(new[name].shape[0] + 1, *new[name].shape[1:])})
        missing = {k: v for k, v in new.items() if k != name}
        extra = dict(new, **{"decoder.layers.9.bogus.weight": torch.zeros(2)})
        cases = [("wrong shape", wrong_shape, (name, "shape")),
                 ("missing tensor", missing, (name, "missing")),
                 ("unexpected tensor", extra, ("decoder.layers.9.bogus.weight", "unexpected"))]
        for what, w, frags in cases:
            await services.expect_error(standalone.load_weights(w, new_version + 100), INVALID,
                                        "LoadWeights", *frags)
            # still serving, with the previously loaded weights, all of them
            got = await standalone.generate_sequences(prompts, **GREEDY)
            assert_same_generation(got, want, f"after {what}")
            assert got.meta["weights_version"] == version
        err = await services.raw_call(services.endpoints["rollout"], "/tandem.v1.RolloutService/LoadWeights",
                                      services.garbage(5))
        assert err.code() == INVALID and "LoadWeightsRequest" in err.details()
        # bad sampling on the standalone service too, then a good load
        await services.expect_error(standalone.generate_sequences(prompts, max_new_tokens=4, top_p=1.5),
                                    INVALID, "top_p")
        assert await standalone.load_weights(new, new_version) == new_version
        assert_same_generation(await standalone.generate_sequences(prompts, **GREEDY),
                               await colocated.generate_sequences(prompts, **GREEDY), "new weights")
        for c in (actor, colocated, standalone):
            await c.close()

    asyncio.run(main())
