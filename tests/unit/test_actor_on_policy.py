"""On-policy updates (UpdateActor with on_policy): the update's own forward pass gives the old
log-probs. Same metrics, same new weights and the same old log-probs, bit for bit, as a
ComputeLogProb pass followed by a normal update; refused where rows would be trained on newer
weights than the ones that sampled them."""
import pytest
import torch
from actor_runs import MEMORY_METRICS
from test_actor_worker import generate, make_worker, weights

from tandem.data.batch import DataProto
from tandem.rpc.errors import InvalidArgument


def deterministic(metrics: dict) -> dict:
    """Without the process's memory figures (they differ between any two updates)."""
    return {k: v for k, v in metrics.items() if k not in MEMORY_METRICS}


def with_advantages(seq, seed=0):
    adv = torch.randn(seq["responses"].shape, generator=torch.Generator().manual_seed(seed))
    return seq.union(DataProto(tensors={"advantages": adv}))


def test_on_policy_update_equals_a_log_prob_pass_then_an_update(megatron_dist, arithmetic_tokenizer):
    # 8 rows in micro-batches of 3 (3, 3, 2): the per-row outputs are put back together in order
    a, b = make_worker(arithmetic_tokenizer), make_worker(arithmetic_tokenizer)
    b.local.policy.load_state_dict(a.local.policy.state_dict())  # in place: the optimizer's params
    b.set_reference()
    assert all(torch.equal(x, y) for x, y in zip(weights(a).values(), weights(b).values()))
    seq = generate(a, arithmetic_tokenizer)
    batch = with_advantages(seq)
    old = a.compute_log_prob(seq)
    metrics_a = a.update_actor(batch.union(old))
    metrics_b, old_b = b.update_actor_on_policy(batch)
    assert torch.equal(old_b["old_log_probs"], old["old_log_probs"])
    assert deterministic(metrics_b) == deterministic(metrics_a) and metrics_b["actor/ppo_kl"] == 0.0
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert b.weights_version == a.weights_version == 1
    # and again from the new weights (the optimizer state came along too)
    seq2 = generate(a, arithmetic_tokenizer, seed=8)
    assert torch.equal(seq2["responses"], generate(b, arithmetic_tokenizer, seed=8)["responses"])
    batch2 = with_advantages(seq2, seed=1)
    metrics_a = a.update_actor(batch2.union(a.compute_log_prob(seq2)))
    metrics_b, _ = b.update_actor_on_policy(batch2)
    assert deterministic(metrics_b) == deterministic(metrics_a)
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("extra,text", [
    (["actor_rollout_ref.actor.ppo_mini_batch_size=2"], "8 rows in mini-batches of 4"),
    (["actor_rollout_ref.actor.ppo_epochs=2"], "ppo_epochs=2"),
])
def test_on_policy_is_refused_where_rows_meet_newer_weights(megatron_dist, arithmetic_tokenizer, extra, text):
    w = make_worker(arithmetic_tokenizer, *extra)
    batch = with_advantages(generate(w, arithmetic_tokenizer))
    before = weights(w)
    with pytest.raises(InvalidArgument) as e:
        w.update_actor_on_policy(batch)
    assert str(e.value).startswith("on_policy:") and text in str(e.value)
    after = weights(w)
    assert w.weights_version == 0 and all(torch.equal(before[k], after[k]) for k in before)
