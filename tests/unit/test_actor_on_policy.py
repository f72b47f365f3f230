"""The rows an update trains on the weights that generated them take its own forward's old log-probs
(ActorFront.update_rows: every row of one mini-batch, else the first mini-batch, unshuffled, one
epoch): a log-prob pass `before_update` leaves them out, and the update's own numbers are bit for
bit the pass's, so the update equals one on a full pass's old log-probs; bad requests change nothing."""
import pytest
import torch
from actor_runs import MEMORY_METRICS
from test_actor_worker import generate, make_worker, weights

from tandem.data.batch import DataProto
from tandem.rpc.errors import InvalidArgument

TWO_MINIS = "actor_rollout_ref.actor.ppo_mini_batch_size=2"  # 2 prompts x n=2: mini-batches of 4 of 8 rows


def deterministic(metrics: dict) -> dict:
    """Without the process's memory figures (they differ between any two updates)."""
    return {k: v for k, v in metrics.items() if k not in MEMORY_METRICS}


def with_advantages(seq, seed=0):
    adv = torch.randn(seq["responses"].shape, generator=torch.Generator().manual_seed(seed))
    return seq.union(DataProto(tensors={"advantages": adv}))


@pytest.mark.parametrize("extra,rows", [((), 8), ((TWO_MINIS,), 4), ((TWO_MINIS, "actor_rollout_ref.actor.shuffle=true"), 0),
                                        (("actor_rollout_ref.actor.ppo_epochs=2",), 0)])
def test_which_rows_the_update_computes_itself(megatron_dist, arithmetic_tokenizer, extra, rows):
    w = make_worker(arithmetic_tokenizer, *extra)
    seq = generate(w, arithmetic_tokenizer)
    assert w.update_rows(seq) == rows
    out, skipped = w.log_probs(seq, with_reference=True, before_update=True)
    full = w.compute_log_prob(seq, with_reference=True)
    assert skipped == rows and torch.equal(out["old_log_probs"][:rows], torch.zeros(rows, seq["responses"].shape[1]))
    assert torch.equal(out["old_log_probs"][rows:], full["old_log_probs"][rows:])
    assert torch.equal(out["ref_log_prob"], full["ref_log_prob"])  # the reference takes every row
    assert w.log_probs(seq, before_update=False)[1] == 0


@pytest.mark.parametrize("extra", [(), (TWO_MINIS,)])
def test_the_updates_own_old_log_probs_are_a_full_passes(megatron_dist, arithmetic_tokenizer, extra):
    a, b = make_worker(arithmetic_tokenizer, *extra), make_worker(arithmetic_tokenizer, *extra)
    b.local.policy.load_state_dict(a.local.policy.state_dict())  # in place: the optimizer's params
    b.set_reference()
    seq = generate(a, arithmetic_tokenizer)
    full = a.compute_log_prob(seq)
    part, own = b.log_probs(seq, before_update=True)
    ua = a.update_actor(with_advantages(seq).union(full))  # the pass's numbers for the own rows too
    ub = b.update_actor(with_advantages(seq).union(part) if own < len(seq) else with_advantages(seq))
    assert ua.update_rows == ub.update_rows == own > 0
    assert torch.equal(ub.old_log_probs["old_log_probs"], full["old_log_probs"])  # its own forward = the pass
    assert torch.equal(ua.old_log_probs["old_log_probs"], full["old_log_probs"])
    assert deterministic(ub.metrics) == deterministic(ua.metrics)
    if own == len(seq):
        assert ub.metrics["actor/ppo_kl"] == 0.0  # one mini-batch: every row on the weights that generated it
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa) and a.weights_version == b.weights_version == 1


def test_several_epochs_compute_no_old_log_probs_and_return_none(megatron_dist, arithmetic_tokenizer):
    w = make_worker(arithmetic_tokenizer, "actor_rollout_ref.actor.ppo_epochs=2")
    seq = generate(w, arithmetic_tokenizer)
    up = w.update_actor(with_advantages(seq).union(w.compute_log_prob(seq)))
    assert up.update_rows == 0 and up.old_log_probs is None and w.weights_version == 1


def test_the_rows_after_update_rows_need_old_log_probs(megatron_dist, arithmetic_tokenizer):
    w = make_worker(arithmetic_tokenizer, TWO_MINIS)
    before = weights(w)
    with pytest.raises(InvalidArgument, match=r"tensor 'old_log_probs': required for rows 4\.\.7"):
        w.update_actor(with_advantages(generate(w, arithmetic_tokenizer)))
    after = weights(w)
    assert w.weights_version == 0 and all(torch.equal(before[k], after[k]) for k in before)
