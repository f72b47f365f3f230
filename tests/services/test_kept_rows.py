"""GenerateSequences(log_probs_after) on the colocated actor (real processes, two DP ranks): the
log-prob pass the actor queues behind the generation answers ComputeLogProb(kept_rows) exactly as
sending the rows does; other settings, or an update since, redo it on the kept rows; a wrong key,
a key with a batch, and bad settings get clear errors and leave the kept rows answering."""
import asyncio
import types

import grpc
import torch

from tandem.data import codec
from tandem.data.batch import DataProto
from tandem.v1 import actor_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT
ONE_CALL = {"with_reference": True, "policy_from_row": 8}  # the controller's: the first mini-batch is the update's


def _equal(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in ("old_log_probs", "ref_log_prob"))


def test_kept_rows_answer_as_the_sent_rows_and_follow_the_weights(services):
    async def main():
        actor, rollout = services.client("actor"), services.client("rollout", "actor")
        prompts = services.prompts(["12+7=", "905+88=", "3+4=", "640+521=", "1+1=", "77+5=", "9+90=", "4+4="])
        sample = {"max_new_tokens": 6, "n": 2, "temperature": 0.7, "seed": 11}  # 16 rows: two mini-batches of 8
        gen = await rollout.generate_sequences(prompts, **sample, log_probs_after=ONE_CALL)
        key = gen.meta["kept_rows"]
        seq = services.sequences(gen)
        sent = await actor.compute_log_prob(seq, **ONE_CALL)
        kept = await actor.kept_log_prob(key, **ONE_CALL)
        assert _equal(kept, sent)
        assert torch.equal(kept["old_log_probs"][:8], torch.zeros(8, 6))  # left to the update
        # settings other than the queued pass's: redone on the kept rows
        assert torch.equal((await actor.kept_log_prob(key))["old_log_probs"],
                           (await actor.compute_log_prob(seq))["old_log_probs"])

        await services.expect_error(actor.kept_log_prob("nope", **ONE_CALL), grpc.StatusCode.FAILED_PRECONDITION,
                                    "kept_rows: 'nope' is not the rows this actor kept", f"it holds '{key}'",
                                    "send the batch")
        both = actor_pb2.ComputeLogProbRequest(batch=codec.encode_batch(seq), kept_rows=key)
        err = await services.raw_call(services.endpoints["actor"], "/tandem.v1.ActorService/ComputeLogProb",
                                      both.SerializeToString())
        assert err.code() == INVALID and "send either the batch or the key" in err.details()
        await services.expect_error(
            rollout.generate_sequences(prompts, **sample, log_probs_after={"policy_from_row": 3}),
            INVALID, "policy_from_row: 3 is not a whole number of mini-batches of 8 rows within the batch's 16")
        assert _equal(await actor.kept_log_prob(key, **ONE_CALL), sent)  # the refused generation kept nothing

        # an update after the queued pass: the answer is the new policy's, as for sent rows
        full = (await actor.compute_log_prob(seq))["old_log_probs"]
        adv = torch.randn(seq["responses"].shape, generator=torch.Generator().manual_seed(2))
        train = services.with_tensor(services.with_tensor(seq, "old_log_probs", full), "advantages", adv)
        await actor.update_actor(train)
        after = await actor.kept_log_prob(key, **ONE_CALL)
        assert _equal(after, await actor.compute_log_prob(seq, **ONE_CALL))
        assert not torch.equal(after["old_log_probs"], kept["old_log_probs"])

        # a generation without log_probs_after keeps nothing and leaves the kept rows as they are
        plain = await rollout.generate_sequences(prompts, **sample)
        assert "kept_rows" not in plain.meta and _equal(await actor.kept_log_prob(key, **ONE_CALL), after)
        await actor.close()
        await rollout.close()

    asyncio.run(main())


def test_update_on_kept_rows_trains_as_the_sent_batch(services, tmp_path):
    """UpdateActor(kept_rows): the batch is the kept rows that kept_row names, the queued pass's old
    log-probs and the sent advantages; the same metrics and weights as sending the whole batch (from
    one checkpoint, first mini-batch on-policy); bad requests refused with the weights unchanged; a
    second update on the same pass (the policy moved since) FAILED_PRECONDITION."""
    async def main():
        actor, rollout = services.client("actor"), services.client("rollout", "actor")
        prompts = services.prompts(["12+7=", "905+88=", "3+4=", "640+521=", "1+1=", "77+5=", "9+90=", "4+4="])
        ckpt = await actor.save_checkpoint(str(tmp_path / "before"))
        after = {"policy_from_row": 8}
        gen = await rollout.generate_sequences(prompts, max_new_tokens=6, n=2, temperature=0.7, seed=5,
                                               log_probs_after=after)
        key, seq = gen.meta["kept_rows"], services.sequences(gen)
        rows = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 15])  # scoring dropped rows 9 and 14
        adv = torch.randn(len(rows), 6, generator=torch.Generator().manual_seed(3))
        send = DataProto(tensors={"kept_row": rows, "advantages": adv})
        version0 = await actor.weights_version()
        bad = [(send.union(DataProto(tensors={"input_ids": seq["input_ids"][rows]})), {"rows": 8},
                INVALID, ("the batch carries ['input_ids']",)),
               (DataProto(tensors={"kept_row": rows + 2, "advantages": adv}), {"rows": 8},
                INVALID, ("kept_row: row numbers must be increasing, within the 16 kept rows",)),
               (send, {"rows": 0}, INVALID, ("kept_row: rows [0, 1", "no old log-probs in the queued pass")),
               (DataProto(tensors={"kept_row": rows.int(), "advantages": adv}), {"rows": 8},
                INVALID, ("'kept_row', int64 [rows]",))]
        for batch, kw, code, frags in bad:
            await services.expect_error(actor.update_actor_kept(key, batch, on_policy=bool(kw["rows"]), **kw),
                                        code, "UpdateActor", *frags)
        await services.expect_error(actor.update_actor_kept("nope", send, on_policy=True, rows=8),
                                    grpc.StatusCode.FAILED_PRECONDITION, "'nope' is not the rows this actor kept")
        assert await actor.weights_version() == version0

        metrics, version, old = await actor.update_actor_kept(key, send, on_policy=True, rows=8)
        assert version == version0 + 1
        trained = (await actor.compute_log_prob(seq))["old_log_probs"]
        await services.expect_error(actor.update_actor_kept(key, send, on_policy=True, rows=8),
                                    grpc.StatusCode.FAILED_PRECONDITION, "changed after the log-prob pass")

        await actor.load_checkpoint(ckpt)  # the same update, the whole batch sent
        part = (await actor.compute_log_prob(seq, policy_from_row=8))["old_log_probs"]
        batch = services.with_tensor(services.with_tensor(seq.index(rows), "old_log_probs", part[rows]),
                                     "advantages", adv)
        sent_metrics, _, sent_old = await actor.update_actor_on_policy(batch, rows=8)
        same = {k for k in metrics if "memory" not in k}  # the host's memory moves between calls
        assert same and {k: metrics[k] for k in same} == {k: sent_metrics[k] for k in same}
        assert torch.equal(old["old_log_probs"], sent_old["old_log_probs"])
        assert torch.equal((await actor.compute_log_prob(seq))["old_log_probs"], trained)
        await actor.close()
        await rollout.close()

    asyncio.run(main())


def test_a_step_whose_actor_lost_the_kept_rows_sends_them(services):
    """The controller's side against the real actor: the generation's key is one the actor does not
    hold (as after a restart), so ComputeLogProb(kept_rows) and UpdateActor(kept_rows) are refused
    and the step sends the rows instead; it trains on them, with the answer of a step that sent them."""
    from tandem.controller.log_probs import EarlyLogProbs
    from tandem.controller.step import train_on_kept
    from tandem.controller.step_context import StepContext

    async def main():
        actor, rollout = services.client("actor"), services.client("rollout", "actor")
        gen = await rollout.generate_sequences(services.prompts(), max_new_tokens=6, n=2, temperature=1.0, seed=9)
        gen.meta["kept_rows"] = "restarted-1"
        scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
        gen.tensors.update(acc=scores, seq_reward=scores)
        roles = types.SimpleNamespace(actor=actor, critic=None, standalone_rollout=False)
        ctx = StepContext(roles=roles, cfg=services.cfg, tokenizer=services.tokenizer, kl_ctrl=None)
        version0, metrics = await actor.weights_version(), {}
        early = EarlyLogProbs(ctx, 1, metrics)
        early.start(gen)  # 8 rows: one mini-batch, every row's old log-probs are the update's own
        assert await train_on_kept(ctx, gen, 1, metrics, early) == version0 + 1
        assert metrics["actor/ppo_kl"] == 0.0 and "training/rollout_probs_diff_max" in metrics
        await actor.close()
        await rollout.close()

    asyncio.run(main())
