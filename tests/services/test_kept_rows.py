"""GenerateSequences(keep) on the colocated actor (real processes, two DP ranks): the rows stay on
the actor, and the log-prob pass it queues behind the generation answers ComputeLogProb on the kept
rows (all of them, or those scoring left) exactly as sending the rows does; other settings, or an
update since, redo it on the kept rows; UpdateActor on kept rows trains as on the sent rows; wrong
keys, bad row numbers and bad batches get clear errors and leave the kept rows answering."""
import asyncio
import types

import grpc
import pytest
import torch

from tandem.controller.clients import KeptRows
from tandem.data.batch import DataProto
from tandem.v1 import actor_pb2

INVALID, FAILED = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
KEEP = {"with_reference": True, "before_update": True}  # the controller's (KL loss): mini-batches of 8 rows
PROMPTS = ["12+7=", "905+88=", "3+4=", "640+521=", "1+1=", "77+5=", "9+90=", "4+4="]
PICKED = [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13]  # scoring dropped the groups of rows 8-9 and 14-15


def _equal(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in ("old_log_probs", "ref_log_prob"))


def test_kept_rows_answer_as_the_sent_rows_and_follow_the_weights(services):
    async def main():
        actor, rollout = services.client("actor"), services.client("rollout", "actor")
        prompts = services.prompts(PROMPTS)
        sample = {"max_new_tokens": 6, "n": 2, "temperature": 0.7, "seed": 11}  # 16 rows: two mini-batches of 8
        gen = await rollout.generate_sequences(prompts, **sample, keep=KEEP)
        key = gen.meta["kept_rows"]
        seq = services.sequences(gen)
        sent, skipped = await actor.compute_log_prob(seq, **KEEP)
        kept, kept_skipped = await actor.compute_log_prob(KeptRows(key), **KEEP)
        assert _equal(kept, sent) and skipped == kept_skipped == 8
        assert torch.equal(kept["old_log_probs"][:8], torch.zeros(8, 6))  # left to the update
        picked, picked_skipped = await actor.compute_log_prob(KeptRows(key, PICKED), **KEEP)
        assert _equal(picked, {k: v[PICKED] for k, v in sent.tensors.items()}) and picked_skipped == 8
        # settings other than the queued pass's: redone on the kept rows
        assert torch.equal((await actor.compute_log_prob(KeptRows(key)))[0]["old_log_probs"],
                           (await actor.compute_log_prob(seq))[0]["old_log_probs"])

        await services.expect_error(actor.compute_log_prob(KeptRows("nope"), **KEEP), FAILED,
                                    "rows.kept.key: 'nope' is not the rows this actor kept", f"it holds '{key}'")
        await services.expect_error(actor.compute_log_prob(KeptRows(key, [3, 1]), **KEEP), INVALID,
                                    "rows.kept.rows: row numbers must be increasing, within the 16 kept rows")
        await services.expect_error(actor.compute_log_prob(KeptRows(key, [16]), **KEEP), INVALID, "within the 16")
        err = await services.raw_call(services.endpoints["actor"], "/tandem.v1.ActorService/ComputeLogProb",
                                      actor_pb2.ComputeLogProbRequest(with_reference=True).SerializeToString())
        assert err.code() == INVALID and "rows: send the rows (rows.batch) or name rows this actor kept" in err.details()
        assert _equal((await actor.compute_log_prob(KeptRows(key), **KEEP))[0], sent)  # the refusals kept it

        # an update after the queued pass: the answer is the new policy's, as for sent rows
        full = (await actor.compute_log_prob(seq))[0]["old_log_probs"]
        adv = torch.randn(seq["responses"].shape, generator=torch.Generator().manual_seed(2))
        await actor.update_actor(seq, DataProto(tensors={"old_log_probs": full, "advantages": adv}))
        after, _ = await actor.compute_log_prob(KeptRows(key), **KEEP)
        assert _equal(after, (await actor.compute_log_prob(seq, **KEEP))[0])
        assert not torch.equal(after["old_log_probs"], kept["old_log_probs"])

        # a generation without keep keeps nothing and leaves the kept rows as they are
        plain = await rollout.generate_sequences(prompts, **sample)
        assert "kept_rows" not in plain.meta and _equal((await actor.compute_log_prob(KeptRows(key), **KEEP))[0], after)
        await actor.close()
        await rollout.close()

    asyncio.run(main())


def test_update_on_kept_rows_trains_as_the_sent_rows(services, tmp_path):
    """UpdateActor on kept rows: the rows picked, the queued pass's old log-probs (the first
    mini-batch's from the update itself) and the sent advantages; the same metrics, old log-probs
    and weights as sending the rows (from one checkpoint); bad requests refused with the weights
    unchanged; a second update on the same pass (the policy moved since) FAILED_PRECONDITION."""
    async def main():
        actor, rollout = services.client("actor"), services.client("rollout", "actor")
        ckpt = await actor.save_checkpoint(str(tmp_path / "before"))
        keep = {"with_reference": False, "before_update": True}
        gen = await rollout.generate_sequences(services.prompts(PROMPTS), max_new_tokens=6, n=2, temperature=0.7,
                                               seed=5, keep=keep)
        key, seq = gen.meta["kept_rows"], services.sequences(gen)
        adv = torch.randn(len(PICKED), 6, generator=torch.Generator().manual_seed(3))
        send = DataProto(tensors={"advantages": adv})
        version0 = await actor.weights_version()
        bad = [(KeptRows(key, PICKED), send.union(DataProto(tensors={"input_ids": seq["input_ids"][PICKED]})),
                INVALID, ("batch: carries ['input_ids']",)),
               (KeptRows(key, [p + 4 for p in PICKED]), send, INVALID, ("rows.kept.rows", "within the 16 kept rows")),
               (KeptRows(key, PICKED[:-1]), send, INVALID, ("batch: 12 rows for the 11 kept rows picked",)),
               (KeptRows("nope", PICKED), send, FAILED, ("'nope' is not the rows this actor kept",))]
        for rows, batch, code, frags in bad:
            await services.expect_error(actor.update_actor(rows, batch), code, "UpdateActor", *frags)
        assert await actor.weights_version() == version0

        metrics, version, old, own = await actor.update_actor(KeptRows(key, PICKED), send)
        assert version == version0 + 1 and own == 8
        trained = (await actor.compute_log_prob(seq))[0]["old_log_probs"]
        await services.expect_error(actor.update_actor(KeptRows(key, PICKED), send), FAILED,
                                    "changed after the log-prob pass")

        await actor.load_checkpoint(ckpt)  # the same update, the rows sent
        part, skipped = await actor.compute_log_prob(seq, **keep)
        assert skipped == 8
        sent_metrics, _, sent_old, sent_own = await actor.update_actor(
            seq.index(PICKED), DataProto(tensors={"old_log_probs": part["old_log_probs"][PICKED], "advantages": adv}))
        same = {k for k in metrics if "memory" not in k}  # the host's memory moves between calls
        assert same and {k: metrics[k] for k in same} == {k: sent_metrics[k] for k in same} and sent_own == 8
        assert torch.equal(old["old_log_probs"], sent_old["old_log_probs"])
        assert torch.equal((await actor.compute_log_prob(seq))[0]["old_log_probs"], trained)
        await actor.close()
        await rollout.close()

    asyncio.run(main())


def test_a_step_on_kept_rows_trains_and_a_key_the_actor_lost_fails_it_clearly(services):
    """The controller's phases 2, 4 and 5 (train_on) against the real actor on kept rows: the update
    trains, the first mini-batch's old log-probs are its own (ppo_kl 0 on one mini-batch); a key the
    actor does not hold (as after a restart) fails the step with the actor's FAILED_PRECONDITION."""
    from tandem.controller.log_probs import Phase2, keep_settings
    from tandem.controller.step import train_on
    from tandem.controller.step_context import StepContext
    from tandem.rpc.errors import FailedPrecondition

    async def main():
        actor, rollout = services.client("actor"), services.client("rollout", "actor")
        roles = types.SimpleNamespace(actor=actor, critic=None, standalone_rollout=False)
        ctx = StepContext(roles=roles, cfg=services.cfg, tokenizer=services.tokenizer, kl_ctrl=None)
        scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
        for key in ("", "restarted-1"):
            gen = await rollout.generate_sequences(services.prompts(), max_new_tokens=6, n=2, temperature=1.0, seed=9,
                                                   keep=keep_settings(ctx, 1))
            gen.meta["kept_rows"] = key or gen.meta["kept_rows"]
            gen.tensors.update(acc=scores, seq_reward=scores)
            version0, metrics = await actor.weights_version(), {}
            if key:
                with pytest.raises(FailedPrecondition, match="'restarted-1' is not the rows this actor kept"):
                    await train_on(ctx, gen, 1, metrics, phase2=Phase2(ctx, gen, 1, metrics))
                assert await actor.weights_version() == version0
                continue
            assert await train_on(ctx, gen, 1, metrics, phase2=Phase2(ctx, gen, 1, metrics)) == version0 + 1
            # 8 rows: one mini-batch, every row's old log-probs are the update's own
            assert metrics["actor/ppo_kl"] == 0.0 and metrics["training/rollout_probs_diff_max"] < 1e-4
        await actor.close()
        await rollout.close()

    asyncio.run(main())
