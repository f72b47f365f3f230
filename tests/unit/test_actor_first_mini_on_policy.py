"""The first mini-batch's old log-probs from the update (ComputeLogProb's policy_from_row,
UpdateActor's on_policy_rows): a log-prob pass over the later mini-batches only, then an update
whose own forward gives the first mini-batch's, is bit for bit a full log-prob pass and an
update (metrics, new weights, the old log-probs it returns); bad requests change nothing."""
import pytest
import torch
from test_actor_on_policy import deterministic, with_advantages
from test_actor_worker import generate, make_worker, weights

from tandem.rpc.errors import InvalidArgument

TWO_MINIS = "actor_rollout_ref.actor.ppo_mini_batch_size=2"  # 2 prompts x n=2: mini-batches of 4 of 8 rows


def twins(tokenizer, *extra):
    a, b = make_worker(tokenizer, TWO_MINIS, *extra), make_worker(tokenizer, TWO_MINIS, *extra)
    b.local.policy.load_state_dict(a.local.policy.state_dict())  # in place: the optimizer's params
    b.set_reference()
    return a, b


def test_the_first_mini_batch_from_the_update_equals_a_full_pass_then_an_update(megatron_dist, arithmetic_tokenizer):
    a, b = twins(arithmetic_tokenizer)
    seq = generate(a, arithmetic_tokenizer)
    full = a.compute_log_prob(seq, with_reference=True)
    part = b.compute_log_prob(seq, with_reference=True, policy_from_row=4)
    assert torch.equal(part["old_log_probs"][:4], torch.zeros(4, seq["responses"].shape[1]))
    assert torch.equal(part["old_log_probs"][4:], full["old_log_probs"][4:])
    assert torch.equal(part["ref_log_prob"], full["ref_log_prob"])  # the reference still takes every row
    metrics_a = a.update_actor(with_advantages(seq).union(full.select(tensor_keys=["old_log_probs"])))
    metrics_b, old_b = b.update_actor_on_policy(
        with_advantages(seq).union(part.select(tensor_keys=["old_log_probs"])), rows=4)
    assert torch.equal(old_b["old_log_probs"], full["old_log_probs"])  # the first rows' from the update's forward
    assert deterministic(metrics_b) == deterministic(metrics_a)
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert b.weights_version == a.weights_version == 1


def test_no_policy_pass_when_the_first_row_is_past_the_batch(megatron_dist, arithmetic_tokenizer):
    w = make_worker(arithmetic_tokenizer, TWO_MINIS)
    seq = generate(w, arithmetic_tokenizer)
    out = w.compute_log_prob(seq, calculate_entropy=True, policy_from_row=8)
    assert torch.equal(out["old_log_probs"], torch.zeros_like(out["old_log_probs"]))
    assert out["entropys"].shape == out["old_log_probs"].shape == seq["responses"].shape


@pytest.mark.parametrize("row", [-4, 3, 12])
def test_bad_policy_from_row_is_refused(megatron_dist, arithmetic_tokenizer, row):
    w = make_worker(arithmetic_tokenizer, TWO_MINIS)
    with pytest.raises(InvalidArgument, match=rf"policy_from_row: {row} is not a whole number of mini-batches of 4"):
        w.compute_log_prob(generate(w, arithmetic_tokenizer), policy_from_row=row)


@pytest.mark.parametrize("extra,rows,text", [
    ((), 2, "2 rows of 8"),  # not the whole first mini-batch
    ((), 8, "8 rows of 8"),  # every row: that is on_policy_rows=0 without old_log_probs
    (("actor_rollout_ref.actor.shuffle=true",), 4, "shuffle off (got True)"),
    (("actor_rollout_ref.actor.ppo_epochs=2",), 4, "ppo_epochs=1 (got 2)"),
    ((), -4, "-4 rows of 8"),
])
def test_on_policy_rows_refused_where_rows_meet_newer_weights(megatron_dist, arithmetic_tokenizer, extra, rows, text):
    w = make_worker(arithmetic_tokenizer, TWO_MINIS, *extra)
    seq = generate(w, arithmetic_tokenizer)
    batch = with_advantages(seq).union(w.compute_log_prob(seq))
    before = weights(w)
    with pytest.raises(InvalidArgument) as e:
        w.update_actor_on_policy(batch, rows=rows)
    assert str(e.value).startswith("on_policy_rows:") and text in str(e.value)
    after = weights(w)
    assert w.weights_version == 0 and all(torch.equal(before[k], after[k]) for k in before)


def test_on_policy_rows_needs_the_later_rows_old_log_probs(megatron_dist, arithmetic_tokenizer):
    w = make_worker(arithmetic_tokenizer, TWO_MINIS)
    with pytest.raises(InvalidArgument, match="on_policy_rows: the batch carries no old_log_probs"):
        w.update_actor_on_policy(with_advantages(generate(w, arithmetic_tokenizer)), rows=4)
    assert w.weights_version == 0
