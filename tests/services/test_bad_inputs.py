"""Bad requests to real service processes: INVALID_ARGUMENT naming the field (NOT_FOUND for
a missing checkpoint), and the next good request on the same service gives the right answer
from unchanged state."""
import asyncio

import grpc
import torch

from tandem.data import codec
from tandem.data.batch import DataProto
from tandem.v1 import actor_pb2, common_pb2, data_pb2, reward_pb2, rollout_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT


async def sampled_batch(services, rollout) -> DataProto:
    gen = await rollout.generate_sequences(services.prompts(), max_new_tokens=6, n=2, temperature=0.7,
                                           top_p=0.9, top_k=5, seed=3)
    assert len(gen) == 8 and gen["responses"].shape == (8, 6)
    return gen


def bad_sequence_batches(services, seq: DataProto) -> list[tuple[str, DataProto, tuple[str, ...]]]:
    """(what, batch, fragments the error message must contain) for the sequence-taking RPCs."""
    ids, mask = seq["input_ids"], seq["attention_mask"]
    oov = ids.clone()
    oov[0, 0] = 10_000
    return [
        ("wrong dtype", services.with_tensor(seq, "input_ids", ids.float()), ("'input_ids'", "float32")),
        ("wrong shape", services.with_tensor(seq, "attention_mask", torch.cat([mask, mask[:, :1]], 1)),
         ("'attention_mask'", "shape")),
        ("missing tensor", services.with_tensor(seq, "responses", None), ("'responses'", "missing")),
        ("token out of vocabulary", services.with_tensor(seq, "input_ids", oov), ("'input_ids'", "10000")),
        ("responses not the tail of input_ids", services.with_tensor(seq, "responses", seq["responses"].flip(1)),
         ("'responses'",)),
    ]


def test_actor_compute_log_prob_bad_inputs(services):
    async def main():
        actor = services.client("actor")
        rollout = services.client("rollout", "actor")  # colocated: the actor serves RolloutService
        gen = await sampled_batch(services, rollout)
        seq = services.sequences(gen)
        good = (await actor.compute_log_prob(seq))["old_log_probs"]
        m = gen["response_mask"].bool()
        # correct output: the rollout's log-probs of the same weights at the same temperature.
        # (The 1e-5 acceptance bound is tests/unit/test_generation.py; this large-init model
        # samples tokens with log-probs near -15, where fp32 rounding alone is ~1e-6 per op.)
        assert (good - gen["rollout_log_probs"])[m].abs().max() < 3e-5

        bad_temp = DataProto(tensors=dict(seq.tensors), meta={"temperature": 0.0})
        cases = bad_sequence_batches(services, seq) + [("temperature 0", bad_temp, ("'temperature'",))]
        for what, batch, frags in cases:
            await services.expect_error(actor.compute_log_prob(batch), INVALID, "ComputeLogProb", *frags)
            again = (await actor.compute_log_prob(seq))["old_log_probs"]
            assert torch.equal(again, good), f"after {what}"
        # the reference model takes the same checks
        await services.expect_error(actor.compute_ref_log_prob(cases[0][1]), INVALID, "'input_ids'")

        err = await services.raw_call(services.endpoints["actor"], "/tandem.v1.ActorService/ComputeLogProb", services.garbage())
        assert err.code() == INVALID
        assert "could not be parsed as tandem.v1.ComputeLogProbRequest" in err.details()
        assert torch.equal((await actor.compute_log_prob(seq))["old_log_probs"], good)
        await actor.close()
        await rollout.close()

    asyncio.run(main())


def test_actor_update_bad_inputs_and_missing_checkpoint_leave_state_intact(services, tmp_path):
    async def main():
        actor = services.client("actor")
        rollout = services.client("rollout", "actor")
        gen = await sampled_batch(services, rollout)
        seq = services.sequences(gen)
        lp0 = (await actor.compute_log_prob(seq))["old_log_probs"]
        version0 = await actor.weights_version()
        adv = torch.randn(seq["responses"].shape, generator=torch.Generator().manual_seed(0))
        train = services.with_tensor(services.with_tensor(seq, "old_log_probs", lp0), "advantages", adv)

        nan_adv = adv.clone()
        nan_adv[1, 2] = float("nan")
        cases = [(what, services.with_tensor(services.with_tensor(b, "old_log_probs", lp0), "advantages", adv), frags)
                 for what, b, frags in bad_sequence_batches(services, seq)] + [
            ("missing old_log_probs", services.with_tensor(train, "old_log_probs", None), ("'old_log_probs'", "missing")),
            ("missing advantages", services.with_tensor(train, "advantages", None), ("'advantages'",)),
            ("advantages float64", services.with_tensor(train, "advantages", adv.double()), ("'advantages'", "float64")),
            ("advantages wrong shape", services.with_tensor(train, "advantages", adv[:, :-1]), ("'advantages'", "shape")),
            ("advantages NaN", services.with_tensor(train, "advantages", nan_adv), ("'advantages'", "NaN")),
            ("one row for two DP ranks", train.slice(0, 1), ("1 rows", "2 data-parallel ranks")),
        ]
        for what, batch, frags in cases:
            await services.expect_error(actor.update_actor(batch), INVALID, "UpdateActor", *frags)
            assert torch.equal((await actor.compute_log_prob(seq))["old_log_probs"], lp0), f"after {what}"

        missing = str(tmp_path / "no_such_dir" / "actor")
        await services.expect_error(actor.load_checkpoint(missing), grpc.StatusCode.NOT_FOUND, "path", "no_such_dir")
        await services.expect_error(actor.call("LoadCheckpoint", common_pb2.LoadCheckpointRequest(path=missing, trunk_only=True)),
                           INVALID, "trunk_only")
        await services.expect_error(actor.save_checkpoint(""), INVALID, "path")
        err = await services.raw_call(services.endpoints["actor"], "/tandem.v1.ActorService/UpdateActor", services.garbage(1))
        assert err.code() == INVALID and "UpdateActorRequest" in err.details()

        # state intact: same log-probs, same weights version after all the failed calls
        assert torch.equal((await actor.compute_log_prob(seq))["old_log_probs"], lp0)
        assert await actor.weights_version() == version0
        # ... and the next good update works, on-policy
        metrics, version = await actor.update_actor(train)
        assert version == version0 + 1
        assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0
        assert not torch.equal((await actor.compute_log_prob(seq))["old_log_probs"], lp0)
        await actor.close()
        await rollout.close()

    asyncio.run(main())


def test_actor_on_policy_update_bad_inputs_then_the_old_log_probs_of_a_separate_pass(services):
    """UpdateActor(on_policy) at DP=2: refused with old_log_probs in the batch or with more rows
    than one mini-batch (state intact); accepted, it returns the old log-probs that
    ComputeLogProb gives, bit for bit, and ppo_kl is 0."""
    async def main():
        actor = services.client("actor")
        rollout = services.client("rollout", "actor")
        seq = services.sequences(await sampled_batch(services, rollout))  # 4 prompts x 2 = one mini-batch
        lp0 = (await actor.compute_log_prob(seq))["old_log_probs"]
        version0 = await actor.weights_version()
        adv = torch.randn(seq["responses"].shape, generator=torch.Generator().manual_seed(1))
        train = services.with_tensor(seq, "advantages", adv)
        twice = DataProto.concat([train, train])  # 16 rows: two mini-batches of 4 prompts x 2
        twice.meta = dict(train.meta)
        cases = [("old_log_probs sent", services.with_tensor(train, "old_log_probs", lp0), ("on_policy", "old_log_probs")),
                 ("two mini-batches", twice, ("on_policy", "16 rows in mini-batches of 8")),
                 ("missing advantages", seq, ("'advantages'", "missing"))]
        for what, batch, frags in cases:
            await services.expect_error(actor.update_actor_on_policy(batch), INVALID, "UpdateActor", *frags)
            assert torch.equal((await actor.compute_log_prob(seq))["old_log_probs"], lp0), f"after {what}"
        assert await actor.weights_version() == version0
        metrics, version, old = await actor.update_actor_on_policy(train)
        assert version == version0 + 1 and metrics["actor/ppo_kl"] == 0.0
        assert torch.equal(old["old_log_probs"], lp0)
        await _first_mini_batch_from_the_update(services, actor, twice, version + 1)
        await actor.close()
        await rollout.close()

    asyncio.run(main())


async def _first_mini_batch_from_the_update(services, actor, twice, version):
    """Two mini-batches (16 rows): the first one's old log-probs left to the update (policy_from_row,
    on_policy_rows); bad requests refused with state intact, then a good one."""
    lp = (await actor.compute_log_prob(twice))["old_log_probs"]
    part = (await actor.compute_log_prob(twice, policy_from_row=8))["old_log_probs"]
    assert torch.equal(part[8:], lp[8:]) and torch.equal(part[:8], torch.zeros_like(part[:8]))
    both = await actor.compute_log_prob(twice, with_reference=True, policy_from_row=8)  # both passes, one read-back
    assert torch.equal(both["old_log_probs"], part)
    assert torch.equal(both["ref_log_prob"], (await actor.compute_ref_log_prob(twice))["ref_log_prob"])
    train = services.with_tensor(twice, "old_log_probs", part)
    await services.expect_error(actor.compute_log_prob(twice, policy_from_row=3), INVALID, "ComputeLogProb",
                                "policy_from_row: 3 is not a whole number of mini-batches of 8")
    for rows, batch, frags in [(4, train, ("on_policy_rows: 4 rows of 16", "(8 rows")),
                               (8, twice, ("missing tensor 'old_log_probs'",))]:
        await services.expect_error(actor.update_actor_on_policy(batch, rows=rows), INVALID, "UpdateActor", *frags)
    bare = actor_pb2.UpdateActorRequest(batch=codec.encode_batch(train), on_policy_rows=8)  # without on_policy
    err = await services.raw_call(services.endpoints["actor"], "/tandem.v1.ActorService/UpdateActor",
                                  bare.SerializeToString())
    assert err.code() == INVALID and "on_policy_rows: set only with on_policy" in err.details()
    assert await actor.weights_version() == version - 1
    assert torch.equal((await actor.compute_log_prob(twice))["old_log_probs"], lp)
    metrics, v, old = await actor.update_actor_on_policy(train, rows=8)
    assert v == version and torch.equal(old["old_log_probs"], lp)  # the first 8 rows' from the update's forward


def test_rollout_generate_bad_inputs(services):
    async def main():
        rollout = services.client("rollout", "actor")
        prompts = services.prompts()
        greedy = dict(max_new_tokens=6, greedy=True)
        good = await rollout.generate_sequences(prompts, **greedy)
        assert good["responses"].shape == (4, 6) and good["response_mask"].sum() > 0

        async def check_still_good(what):
            again = await rollout.generate_sequences(prompts, **greedy)
            for k in ("responses", "response_mask", "rollout_log_probs", "input_ids"):
                assert torch.equal(again[k], good[k]), f"{k} after {what}"

        ids, mask = prompts["input_ids"], prompts["attention_mask"]
        oov = ids.clone()
        oov[1, -1] = 10_000
        sampling = dict(max_new_tokens=6, temperature=0.7, top_p=0.9, seed=1)
        cases = [
            ("max_new_tokens 0", prompts, dict(sampling, max_new_tokens=0), ("max_new_tokens",)),
            ("top_p 1.5", prompts, dict(sampling, top_p=1.5), ("top_p",)),
            ("temperature 0 without greedy", prompts, dict(sampling, temperature=0.0), ("temperature", "greedy")),
            ("n 0", prompts, dict(sampling, n=0), ("sampling.n",)),
            ("prompt token out of vocabulary", services.with_tensor(prompts, "input_ids", oov), sampling,
             ("'input_ids'", "10000")),
            ("wrong dtype", services.with_tensor(prompts, "input_ids", ids.float()), sampling, ("'input_ids'", "float32")),
            ("wrong shape", services.with_tensor(prompts, "attention_mask", mask[:, 1:]), sampling, ("'attention_mask'",)),
            ("missing attention_mask", services.with_tensor(prompts, "attention_mask", None), sampling,
             ("'attention_mask'", "missing")),
        ]
        for what, batch, kw, frags in cases:
            await services.expect_error(rollout.generate_sequences(batch, **kw), INVALID, "GenerateSequences", *frags)
            await check_still_good(what)
        # stop token out of vocabulary (not exposed by the typed client: raw request)
        req = rollout_pb2.GenerateSequencesRequest(batch=codec.encode_batch(prompts), sampling=rollout_pb2.SamplingParams(
            max_new_tokens=4, greedy=True, stop_token_ids=[services.vocab_size + 3]))
        await services.expect_error(rollout.call("GenerateSequences", req), INVALID, "stop_token_ids")
        err = await services.raw_call(services.endpoints["actor"], "/tandem.v1.RolloutService/GenerateSequences", services.garbage(2))
        assert err.code() == INVALID and "GenerateSequencesRequest" in err.details()
        # the colocated rollout shares the actor's weights: it takes none
        await services.expect_error(rollout.sync_weights(1, services.endpoints["actor"]),
                                    grpc.StatusCode.FAILED_PRECONDITION, "colocated")
        await services.expect_error(rollout.call("GenerateSequences", rollout_pb2.GenerateSequencesRequest(
            batch=codec.encode_batch(prompts), sampling=rollout_pb2.SamplingParams(max_new_tokens=4, greedy=True,
                                                                                   row_offset=-1))),
            INVALID, "row_offset")
        await check_still_good("garbage bytes")
        await rollout.close()

    asyncio.run(main())


def test_critic_bad_inputs(services):
    async def main():
        critic = services.client("critic")
        rollout = services.client("rollout", "actor")
        seq = services.sequences(await sampled_batch(services, rollout))
        # one value update so the values are not the fresh head's zeros
        values = (await critic.compute_values(seq))["values"]
        assert values.shape == seq["responses"].shape and values.dtype == torch.float32
        upd = services.with_tensor(services.with_tensor(seq, "values", values), "returns", torch.ones_like(values))
        metrics = await critic.update_critic(upd)
        assert metrics["critic/vf_loss"] > 0
        good = (await critic.compute_values(seq))["values"]
        assert good.abs().max() > 0

        for what, batch, frags in bad_sequence_batches(services, seq):
            await services.expect_error(critic.compute_values(batch), INVALID, "ComputeValues", *frags)
            assert torch.equal((await critic.compute_values(seq))["values"], good), f"after {what}"
        for what, batch, frags in [
            ("missing returns", services.with_tensor(upd, "returns", None), ("'returns'", "missing")),
            ("values wrong dtype", services.with_tensor(upd, "values", values.double()), ("'values'", "float64")),
        ]:
            await services.expect_error(critic.update_critic(batch), INVALID, "UpdateCritic", *frags)
            assert torch.equal((await critic.compute_values(seq))["values"], good), f"after {what}"
        err = await services.raw_call(services.endpoints["critic"], "/tandem.v1.CriticService/ComputeValues", services.garbage(3))
        assert err.code() == INVALID and "ComputeValuesRequest" in err.details()
        await services.expect_error(critic.load_checkpoint("/nonexistent/critic"), grpc.StatusCode.NOT_FOUND, "path")
        assert torch.equal((await critic.compute_values(seq))["values"], good)
        await critic.close()
        await rollout.close()

    asyncio.run(main())


def test_reward_bad_inputs(services):
    async def main():
        reward = services.client("reward")
        cols = {"response_text": ["579", "12", "7"], "ground_truth": ["579", "13", "7"],
                "data_source": ["tandem/arithmetic"] * 3}
        good = DataProto(columns=cols)
        assert await reward.score(good) == [1.0, 0.0, 1.0]

        def without(name):
            return DataProto(columns={k: v for k, v in cols.items() if k != name})

        cases = [
            ("missing ground_truth", without("ground_truth"), ("missing column 'ground_truth'",)),
            ("missing response_text", without("response_text"), ("missing column 'response_text'",)),
            ("ground_truth not strings", DataProto(columns=dict(cols, ground_truth=[579, 12, 7])),
             ("column 'ground_truth'", "not a string")),
            ("ground_truth as a tensor", DataProto(tensors={"ground_truth": torch.tensor([579, 13, 7])},
                                                   columns=without("ground_truth").columns),
             ("'ground_truth'", "tensor")),
        ]
        for what, batch, frags in cases:
            await services.expect_error(reward.score(batch), INVALID, "Score", *frags)
            assert await reward.score(good) == [1.0, 0.0, 1.0], f"after {what}"
        # rows that disagree (cannot be built as a DataProto: raw message)
        pb = data_pb2.Batch()
        pb.columns.add(name="response_text", values=["1", "2"])
        pb.columns.add(name="ground_truth", values=["1"])
        await services.expect_error(reward.call("Score", reward_pb2.ScoreRequest(batch=pb)), INVALID,
                           "'ground_truth'", "rows")
        err = await services.raw_call(services.endpoints["reward"], "/tandem.v1.RewardService/Score", services.garbage(4))
        assert err.code() == INVALID and "ScoreRequest" in err.details()
        assert await reward.score(good) == [1.0, 0.0, 1.0]
        await reward.close()

    asyncio.run(main())


def test_garbage_is_not_a_message(services):
    """The garbage payload really fails to parse (else the checks above would test nothing)."""
    for seed in range(5):
        for cls in (actor_pb2.ComputeLogProbRequest, reward_pb2.ScoreRequest):
            try:
                cls.FromString(services.garbage(seed))
            except Exception:  # noqa: BLE001 - protobuf's DecodeError
                continue
            raise AssertionError(f"services.garbage({seed}) parsed as {cls.__name__}")
