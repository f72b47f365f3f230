"""Phase 2 of a step, the controller's side (controller/log_probs.py): what it asks the colocated
actor to queue behind a generation, and how the rows scoring keeps name the rows and pick the
results (the actor and critic here answer with their rows' numbers, so a wrong pick shows)."""
import asyncio
import types

import pytest
import torch

from tandem.config import load_config
from tandem.controller.clients import KeptRows
from tandem.controller.log_probs import Phase2, keep_settings
from tandem.controller.step_context import StepContext
from tandem.data.batch import DataProto

BASE = ["actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.use_kl_loss=true"]


def _ctx(extra=(), actor=None, critic=None) -> StepContext:
    cfg = load_config(None, [*BASE, *extra])
    return StepContext(roles=types.SimpleNamespace(actor=actor, critic=critic), cfg=cfg, tokenizer=None, kl_ctrl=None)


@pytest.mark.parametrize("extra,step,settings", [
    ((), 1, {"with_reference": True, "before_update": True}),
    (("actor_rollout_ref.actor.use_kl_loss=false",), 1, {"with_reference": False, "before_update": True}),
    (("algorithm.use_kl_in_reward=true",), 1, {"with_reference": True, "before_update": False}),  # read before it
    (("trainer.critic_warmup=1", "algorithm.adv_estimator=gae"), 1, {"with_reference": True, "before_update": False}),
    (("trainer.critic_warmup=1", "algorithm.adv_estimator=gae"), 2, {"with_reference": True, "before_update": True}),
])
def test_the_pass_queued_behind_the_generation(extra, step, settings):
    assert keep_settings(_ctx(extra), step) == settings


class NumberedActor:
    """Answers ComputeLogProb with each row's number as its log-probs, and records the calls."""

    def __init__(self, rows: int):
        self.rows, self.calls = rows, []

    async def compute_log_prob(self, rows, **settings):
        self.calls.append((rows, settings))
        numbers = torch.arange(self.rows, dtype=torch.float32)[:, None].expand(self.rows, 3)
        return DataProto(tensors={"old_log_probs": numbers, "ref_log_prob": -numbers}), 0


class NumberedCritic:
    async def compute_values(self, seq):
        return DataProto(tensors={"values": torch.arange(len(seq), dtype=torch.float32)[:, None].expand(len(seq), 3)})


def generated(rows: int, kept: str = "") -> DataProto:
    gen = DataProto(tensors={"input_ids": torch.arange(rows)[:, None].expand(rows, 5).contiguous(),
                             "attention_mask": torch.ones(rows, 5, dtype=torch.long),
                             "responses": torch.arange(rows)[:, None].expand(rows, 2).contiguous(),
                             "response_mask": torch.ones(rows, 2, dtype=torch.long)},
                    meta={"temperature": 1.0})
    if kept:
        gen.meta["kept_rows"] = kept
    return gen


@pytest.mark.parametrize("kept", ["key-1", ""])
def test_the_rows_scoring_keeps_name_the_rows_and_pick_the_results(kept):
    actor = NumberedActor(8)
    ctx = _ctx(("algorithm.adv_estimator=gae",), actor=actor, critic=NumberedCritic())

    async def run():
        phase2 = Phase2(ctx, generated(8, kept), step=1, timings={})
        phase2.pick(torch.tensor([0, 1, 4, 5]))  # scoring dropped the groups of rows 2-3 and 6-7
        return phase2, await phase2.result()

    phase2, lp = asyncio.run(run())
    (sent, settings), = actor.calls
    assert settings == {"with_reference": True, "before_update": True}
    picked = [0, 1, 4, 5]
    if kept:  # the pass on every kept row; the update names the ones left
        assert sent == KeptRows("key-1") and phase2.rows() == KeptRows("key-1", picked)
    else:
        assert len(sent) == 8 and phase2.rows()["responses"][:, 0].tolist() == picked
    assert phase2.sequences()["input_ids"][:, 0].tolist() == picked and phase2.sequences().meta["rollout_n"] == 2
    for got, sign in ((lp.old["old_log_probs"], 1), (lp.ref["ref_log_prob"], -1), (lp.values["values"], 1)):
        assert got[:, 0].tolist() == [sign * float(r) for r in picked]
