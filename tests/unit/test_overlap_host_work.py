"""actor.overlap_host_work (packings built per micro-batch, just before each forward): the same
old and reference log-probs, update metrics and new weights, bit for bit, as with it off; ppo_kl
is still exactly 0 on the first on-policy mini-batch. And the packing's vectorised fields equal
their per-sequence definitions."""
import torch
from test_actor_on_policy import deterministic, with_advantages
from test_actor_worker import generate, make_worker, weights

from tandem.models.packing import Packing

# 2 mini-batches of 2 prompts x n=2 = 4 rows: the old log-probs come in 2 shards (read back
# once per call), each in micro-batches of 3 and 1
TWO_MINIS = ["actor_rollout_ref.actor.ppo_mini_batch_size=2"]


def test_same_results_with_and_without_overlap(megatron_dist, arithmetic_tokenizer):
    off = make_worker(arithmetic_tokenizer, *TWO_MINIS)
    on = make_worker(arithmetic_tokenizer, *TWO_MINIS, "actor_rollout_ref.actor.overlap_host_work=true")
    assert on.actor_cfg.overlap_host_work and not off.actor_cfg.overlap_host_work
    on.local.policy.load_state_dict(off.local.policy.state_dict())
    on.set_reference()
    off.set_reference()
    seq = generate(off, arithmetic_tokenizer)
    old_off, old_on = off.compute_log_prob(seq), on.compute_log_prob(seq)
    assert torch.equal(old_on["old_log_probs"], old_off["old_log_probs"])
    assert torch.equal(on.compute_ref_log_prob(seq)["ref_log_prob"], off.compute_ref_log_prob(seq)["ref_log_prob"])
    batch = with_advantages(seq).union(old_off)
    m_off, m_on = off.update_actor(batch), on.update_actor(batch)
    assert deterministic(m_on) == deterministic(m_off)
    w_off, w_on = weights(off), weights(on)
    assert all(torch.equal(w_off[k], w_on[k]) for k in w_off)


def test_on_policy_update_with_overlap(megatron_dist, arithmetic_tokenizer):
    # one mini-batch (the on-policy case): the update's own old log-probs, read back after the loop
    w = make_worker(arithmetic_tokenizer, "actor_rollout_ref.actor.overlap_host_work=true")
    seq = generate(w, arithmetic_tokenizer)
    old = w.compute_log_prob(seq)
    metrics, old_b = w.update_actor_on_policy(with_advantages(seq))
    assert old_b["old_log_probs"].device.type == "cpu"
    assert torch.equal(old_b["old_log_probs"], old["old_log_probs"]) and metrics["actor/ppo_kl"] == 0.0


def test_vectorised_packing_fields_match_their_definitions():
    g = torch.Generator().manual_seed(0)
    prompt, response = torch.randint(1, 9, (6,), generator=g), torch.randint(1, 7, (6,), generator=g)
    cols = torch.arange(16)[None]
    mask = ((cols >= 8 - prompt[:, None]) & (cols < 8 + response[:, None])).long()
    for multiple in (1, 8):
        p = Packing(mask, multiple=multiple)
        seqlens = (p.cu_seqlens[1:] - p.cu_seqlens[:-1]).tolist()
        assert p.filler > 0 or multiple == 1
        assert torch.equal(p.positions, torch.cat([torch.arange(n) for n in seqlens]))
        idx, valid = p.index_valid(7, 8, predicts=True)
        p.keep_responses(8)
        assert torch.equal(p.kept, torch.unique(idx[valid]))


def test_packings_are_built_per_micro_batch_with_overlap(megatron_dist, arithmetic_tokenizer, monkeypatch):
    """With the key on, the first forward runs after one packing (the others are built as their
    micro-batches come); with it off, after all of them."""
    import tandem.train.schedule as schedule

    built, at_forward = [], []

    class Counted(Packing):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            built.append(self)

    monkeypatch.setattr(schedule, "Packing", Counted)
    for on in (False, True):
        w = make_worker(arithmetic_tokenizer, *([f"actor_rollout_ref.actor.overlap_host_work={str(on).lower()}"]))
        hook = w.local.policy.register_forward_pre_hook(lambda *_: at_forward.append(len(built)))
        built.clear()
        at_forward.clear()
        w.compute_log_prob(generate(w, arithmetic_tokenizer))  # 8 rows: micro-batches of 3, 3, 2
        hook.remove()
        assert at_forward == ([1, 2, 3] if on else [3, 3, 3])
