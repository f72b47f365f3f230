"""Bad requests to real service processes: INVALID_ARGUMENT naming the field (NOT_FOUND for
a missing checkpoint), and the next good request on the same service gives the right answer
from unchanged state."""
import asyncio
import os

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


UPDATE_KEYS = ("advantages", "old_log_probs", "ref_log_prob", "rollout_log_probs")


async def update(actor, batch: DataProto):
    """UpdateActor on `batch`'s rows with its per-row training tensors."""
    rows = batch.select(tensor_keys=[k for k in batch.tensors if k not in UPDATE_KEYS])
    return await actor.update_actor(rows, batch.select(tensor_keys=[k for k in batch.tensors if k in UPDATE_KEYS]))


async def log_probs(actor, batch: DataProto, **kw) -> torch.Tensor:
    return (await actor.compute_log_prob(batch, **kw))[0]["old_log_probs"]


def test_actor_compute_log_prob_bad_inputs(services):
    async def main():
        actor = services.client("actor")
        rollout = services.client("rollout", "actor")  # colocated: the actor serves RolloutService
        gen = await sampled_batch(services, rollout)
        seq = services.sequences(gen)
        good = await log_probs(actor, seq)
        m = gen["response_mask"].bool()
        # correct output: the rollout's log-probs of the same weights at the same temperature.
        # (The 1e-5 acceptance bound is tests/unit/test_generation.py; this large-init model
        # samples tokens with log-probs near -15, where fp32 rounding alone is ~1e-6 per op.)
        assert (good - gen["rollout_log_probs"])[m].abs().max() < 3e-5

        bad_temp = DataProto(tensors=dict(seq.tensors), meta={"temperature": 0.0})
        cases = bad_sequence_batches(services, seq) + [("temperature 0", bad_temp, ("'temperature'",))]
        for what, batch, frags in cases:
            await services.expect_error(actor.compute_log_prob(batch), INVALID, "ComputeLogProb", *frags)
            assert torch.equal(await log_probs(actor, seq), good), f"after {what}"
        # the reference's pass takes the same checks
        await services.expect_error(actor.compute_log_prob(cases[0][1], with_reference=True, before_update=True),
                                    INVALID, "'input_ids'")

        err = await services.raw_call(services.endpoints["actor"], "/tandem.v1.ActorService/ComputeLogProb", services.garbage())
        assert err.code() == INVALID
        assert "could not be parsed as tandem.v1.ComputeLogProbRequest" in err.details()
        assert torch.equal(await log_probs(actor, seq), good)
        await actor.close()
        await rollout.close()

    asyncio.run(main())


def test_actor_update_bad_inputs_and_missing_checkpoint_leave_state_intact(services, tmp_path):
    async def main():
        actor = services.client("actor")
        rollout = services.client("rollout", "actor")
        gen = await sampled_batch(services, rollout)
        seq = services.sequences(gen)
        lp0 = await log_probs(actor, seq)
        version0 = await actor.weights_version()
        adv = torch.randn(seq["responses"].shape, generator=torch.Generator().manual_seed(0))
        train = services.with_tensor(seq, "advantages", adv)  # one mini-batch: the update's own old log-probs

        nan_adv = adv.clone()
        nan_adv[1, 2] = float("nan")
        cases = [(what, services.with_tensor(b, "advantages", adv), frags)
                 for what, b, frags in bad_sequence_batches(services, seq)] + [
            ("missing advantages", seq, ("'advantages'",)),
            ("advantages float64", services.with_tensor(train, "advantages", adv.double()), ("'advantages'", "float64")),
            ("advantages wrong shape", services.with_tensor(train, "advantages", adv[:, :-1]), ("'advantages'", "shape")),
            ("advantages NaN", services.with_tensor(train, "advantages", nan_adv), ("'advantages'", "NaN")),
            ("one row for two DP ranks", train.slice(0, 1), ("1 rows", "2 data-parallel ranks")),
        ]
        for what, batch, frags in cases:
            await services.expect_error(update(actor, batch), INVALID, "UpdateActor", *frags)
            assert torch.equal(await log_probs(actor, seq), lp0), f"after {what}"
        await services.expect_error(actor.update_actor(seq, DataProto(tensors={"advantages": adv[:4]})), INVALID,
                                    "UpdateActor", "batch: 4 rows for the 8 rows sent")
        await services.expect_error(actor.update_actor(seq, DataProto(tensors={"advantages": adv, "values": adv})),
                                    INVALID, "UpdateActor", "batch: carries ['values']")

        missing = str(tmp_path / "no_such_dir" / "actor")
        await services.expect_error(actor.load_checkpoint(missing), grpc.StatusCode.NOT_FOUND, "path", "no_such_dir")
        await services.expect_error(actor.call("LoadCheckpoint", common_pb2.LoadCheckpointRequest(path=missing, trunk_only=True)),
                           INVALID, "trunk_only")
        await services.expect_error(actor.save_checkpoint(""), INVALID, "path")
        err = await services.raw_call(services.endpoints["actor"], "/tandem.v1.ActorService/UpdateActor", services.garbage(1))
        assert err.code() == INVALID and "UpdateActorRequest" in err.details()

        # state intact: same log-probs, same weights version after all the failed calls
        assert torch.equal(await log_probs(actor, seq), lp0)
        assert await actor.weights_version() == version0
        # ... and the next good update works, its old log-probs its own forward's: the pass's, bit for bit
        metrics, version, old, own = await update(actor, train)
        assert version == version0 + 1 and own == 8 and torch.equal(old["old_log_probs"], lp0)
        assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/pg_clipfrac"] == 0.0
        assert not torch.equal(await log_probs(actor, seq), lp0)
        await actor.close()
        await rollout.close()

    asyncio.run(main())


def test_actor_first_mini_batch_from_the_update_at_dp2(services):
    """Two mini-batches (16 rows) at DP=2: a pass before_update leaves the first mini-batch's old
    log-probs to the update, the reference still takes every row; an update without the later rows'
    old log-probs is refused with state intact; the good one returns the full pass's, bit for bit."""
    async def main():
        actor = services.client("actor")
        rollout = services.client("rollout", "actor")
        seq = services.sequences(await sampled_batch(services, rollout))
        adv = torch.randn(seq["responses"].shape, generator=torch.Generator().manual_seed(1))
        twice = DataProto.concat([services.with_tensor(seq, "advantages", adv)] * 2)  # mini-batches of 4 prompts x 2
        twice.meta = dict(seq.meta)
        version0 = await actor.weights_version()
        lp = await log_probs(actor, twice)
        part, skipped = await actor.compute_log_prob(twice, with_reference=True, before_update=True)
        assert skipped == 8 and torch.equal(part["old_log_probs"][8:], lp[8:])
        assert torch.equal(part["old_log_probs"][:8], torch.zeros_like(lp[:8]))
        assert torch.equal(part["ref_log_prob"], (await actor.compute_log_prob(twice, with_reference=True))[0]["ref_log_prob"])
        await services.expect_error(update(actor, twice), INVALID, "UpdateActor",
                                    "tensor 'old_log_probs': required for rows 8..15")
        assert await actor.weights_version() == version0 and torch.equal(await log_probs(actor, twice), lp)
        metrics, v, old, own = await update(actor, services.with_tensor(twice, "old_log_probs", part["old_log_probs"]))
        assert v == version0 + 1 and own == 8 and torch.equal(old["old_log_probs"], lp)  # the first 8 its own
        await actor.close()
        await rollout.close()

    asyncio.run(main())


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
    # started from the policy, the critic drew no weights: before the warm start's trunk load it refused
    # to save (and to compute), writing nothing (tests/helpers/service_procs.critic_from_policy)
    from tandem.rpc.errors import FailedPrecondition

    refused = services.critic_before_load
    assert isinstance(refused, FailedPrecondition), refused
    assert "not loaded yet" in str(refused) and "LoadCheckpoint comes first" in str(refused)
    assert not os.path.exists(os.path.join(services.run_dir, "checkpoints", "init", "critic"))

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
