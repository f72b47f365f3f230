"""trainer.log_probs_after_generation, the controller's side: which log-prob pass it asks the
colocated actor to queue behind a generation, and what a step does when the actor no longer holds
the kept rows (a restart): it sends the rows, with the same answer."""
import asyncio
import types

import pytest
import torch

from tandem.config import load_config
from tandem.controller.log_probs import EarlyLogProbs, log_probs_and_values
from tandem.controller.step_context import StepContext
from tandem.data.batch import DataProto
from tandem.rpc.errors import FailedPrecondition

BASE = ["actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.rollout.mode=colocated"]


def _ctx(extra=(), actor=None, standalone=False) -> StepContext:
    cfg = load_config(None, [*BASE, *extra])
    roles = types.SimpleNamespace(actor=actor, critic=None, standalone_rollout=standalone)
    return StepContext(roles=roles, cfg=cfg, tokenizer=None, kl_ctrl=None)


@pytest.mark.parametrize("extra,standalone,rows,step,queued", [
    ((), False, 8, 1, (True, 4)),  # two mini-batches: the second's old pass and the reference's
    ((), False, 4, 1, (True, 4)),  # one mini-batch: the reference's pass alone
    (("actor_rollout_ref.actor.use_kl_loss=false",), False, 8, 1, (False, 4)),  # the old pass alone
    (("actor_rollout_ref.actor.use_kl_loss=false",), False, 4, 1, None),  # no pass at all
    (("trainer.log_probs_one_call=false",), False, 8, 1, None),  # two actor calls: sent as before
    (("trainer.log_probs_after_generation=false",), False, 8, 1, None),
    ((), True, 8, 1, None),  # a standalone rollout is not the actor's process
    (("trainer.critic_warmup=1", "algorithm.adv_estimator=gae"), False, 8, 1, (True, 0)),  # no update: every row
])
def test_the_pass_queued_behind_the_generation(extra, standalone, rows, step, queued):
    plan = EarlyLogProbs(_ctx(extra, standalone=standalone), step, {}).queue_after(rows)
    assert (None if plan is None else (plan["with_reference"], plan["policy_from_row"])) == queued


def test_rows_no_longer_kept_are_sent():
    class RestartedActor:  # it answers ComputeLogProb(kept_rows) as a restarted service does
        def __init__(self):
            self.sent = []

        async def kept_log_prob(self, kept_rows, **settings):
            raise FailedPrecondition(f"kept_rows: {kept_rows!r} is not the rows this actor kept (it holds none)")

        async def compute_log_prob(self, seq, **settings):
            self.sent.append(settings)
            return DataProto(tensors={"old_log_probs": torch.full((len(seq), 3), -1.0),
                                      "ref_log_prob": torch.full((len(seq), 3), -2.0)})

    actor = RestartedActor()
    seq = DataProto(tensors={"input_ids": torch.zeros(8, 5, dtype=torch.long)})
    lp = asyncio.run(log_probs_and_values(_ctx(actor=actor), seq, own=4, kept="gone-1"))
    assert actor.sent == [{"with_reference": True, "policy_from_row": 4}]
    assert lp.own == 4 and torch.equal(lp.old["old_log_probs"], torch.full((8, 3), -1.0))
    assert torch.equal(lp.ref["ref_log_prob"], torch.full((8, 3), -2.0))
