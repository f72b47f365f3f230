"""Rows that share a prompt packed with one copy of it (tandem/models/shared_prompts.py) against
the plain packed layout: same log-probs, entropies, PPO loss and gradients, fewer tokens."""
import functools

import pytest
import torch
from test_packing import VOCAB, model  # noqa: F401  (the module's model fixture)

from tandem.models.packing import PackedOutput, Packing, packed_rope, selected_outputs
from tandem.models.shared_prompts import SharedPromptPacking

PW, RW = 5, 4  # [left-padded prompt | right-padded response] widths
# (prompt id, prompt length, response length) per row: groups of 3, 2, 1 rows, then 2 rows whose
# prompts have the same length but other tokens (no group), and a row with a 1-token response
ROWS = [(0, 5, 4), (0, 5, 1), (0, 5, 3), (1, 2, 2), (1, 2, 4), (2, 3, 3), (3, 3, 2), (4, 3, 1)]


def grouped_batch():
    from tandem.data.batch import DataProto

    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, VOCAB, (5, PW), generator=g)
    ids = torch.zeros(len(ROWS), PW + RW, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (pid, p, r) in enumerate(ROWS):
        ids[i, PW - p:PW] = prompts[pid, PW - p:]
        ids[i, PW:PW + r] = torch.randint(2, VOCAB, (r,), generator=g)
        mask[i, PW - p:PW + r] = 1
    return DataProto(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, PW:],
                              "response_mask": mask[:, PW:], "advantages": torch.randn(len(ROWS), RW, generator=g)})


def test_layout():
    mb = grouped_batch()
    p = SharedPromptPacking(mb["attention_mask"], mb["input_ids"], RW, multiple=4)
    plain = Packing(mb["attention_mask"])
    # group 0 saves 2 prompts of 5, group 1 one of 2; each of the 8 responses leaves its last token out
    assert p.groups == 5 and p.total - p.filler == 5 + 2 + 3 + 3 + 3 + (20 - 8) == plain.total - 5 * 2 - 2 - 8
    assert p.total % 4 == 0
    # group 0: prompt (5) then its three responses (4, 1, 3) less their last tokens, positions
    # restart at the prompt's end
    assert p.positions[:10].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 5, 6]
    assert p.segments[:10].tolist() == [0] * 5 + [1] * 3 + [3] * 2
    packed = p.pack(mb["input_ids"])[0]
    idx, valid = p.index_valid(0, PW + RW, predicts=True)  # every token but each row's last
    for i in range(len(ROWS)):
        real = mb["attention_mask"][i].bool()
        last = int(real.nonzero().max())
        assert valid[i].tolist() == [bool(r) and j != last for j, r in enumerate(real.tolist())]
        assert packed[idx[i][valid[i]]].tolist() == mb["input_ids"][i][valid[i]].tolist()
    with pytest.raises(ValueError, match="last token"):  # a read of what was left out
        p.index_valid(0, PW + RW)


def _run(model, mb, packing):  # noqa: F811
    from tandem.config import ActorConfig
    from tandem.data.batch import DataProto
    from tandem.train.losses import ON_POLICY_ROW, ppo_actor_loss

    mb = mb.union(DataProto(tensors={ON_POLICY_ROW: torch.ones(len(mb), dtype=torch.bool)}))  # its own old log-probs
    packing.keep_responses(RW)
    dev = torch.device("cpu")
    model.zero_grad(set_to_none=True)
    with packed_rope(model, packing, dev), selected_outputs(model, packing, dev):
        out = model(packing.pack(mb["input_ids"]), None, None, packed_seq_params=packing.params(dev))
    loss_fn = functools.partial(ppo_actor_loss, cfg=ActorConfig(entropy_coeff=0.01), temperature=0.7)
    loss, _, metrics = loss_fn(PackedOutput(out, packing), mb)
    loss.backward()
    return out.shape[1], loss.detach(), metrics, {n: q.grad.clone() for n, q in model.named_parameters()}


@pytest.mark.parametrize("multiple", [1, 3])
def test_same_log_probs_loss_and_gradients(model, multiple):  # noqa: F811
    mb = grouped_batch()
    rmask = mb["response_mask"].bool()
    n_plain, loss_plain, m_plain, g_plain = _run(model, mb, Packing(mb["attention_mask"], multiple))
    shared = SharedPromptPacking(mb["attention_mask"], mb["input_ids"], RW, multiple)
    n_shared, loss_shared, m_shared, g_shared = _run(model, mb, shared)
    # the LM head's positions: one per response token, in both (a group's last prompt token repeated
    # for each of its rows: the readers take the head's output without gathering it)
    assert n_plain == n_shared == int(rmask.sum()) == 20
    lp_plain, lp_shared = m_plain["old_log_probs"], m_shared["old_log_probs"]
    assert lp_plain[rmask].std() > 0.1  # log-probs that differ by row and position
    diffs = {"log_probs": (lp_plain - lp_shared)[rmask].abs().max(),
             "loss": (loss_plain - loss_shared).abs(),
             "entropy": (m_plain["actor/entropy"] - m_shared["actor/entropy"]).abs()}
    diffs.update({n: (g - g_shared[n]).abs().max() / g.abs().max() for n, g in g_plain.items()})
    assert max(diffs.values()) < 1e-5, {k: float(v) for k, v in diffs.items() if v >= 1e-5}
    assert all(g.abs().sum() > 0 for g in g_shared.values())


def test_prompts_of_other_rows_stay_out_of_attention(model):  # noqa: F811
    """A response's outputs do not change when another sample of its group changes, and a
    response's last token (left out) changes none."""
    mb = grouped_batch()
    shared = SharedPromptPacking(mb["attention_mask"], mb["input_ids"], RW)
    other, last = grouped_batch(), grouped_batch()
    other["input_ids"][2, PW] = (other["input_ids"][2, PW] + 1) % VOCAB  # row 2's first response token, group 0
    last["input_ids"][1, PW] = (last["input_ids"][1, PW] + 1) % VOCAB  # row 1's only (last) response token
    dev = torch.device("cpu")
    with torch.no_grad(), packed_rope(model, shared, dev):
        a, b, c = (model(shared.pack(x["input_ids"]), None, None, packed_seq_params=shared.params(dev))
                   for x in (mb, other, last))
    changed = (a - b).abs().amax(-1)[0] > 0
    assert changed.nonzero().squeeze(1).tolist() == [8, 9]  # row 2's two packed response tokens only
    assert torch.equal(a, c)


def test_readers_take_the_heads_output_without_a_copy(model):  # noqa: F811
    """The LM head runs once per response token in row order (a group's last prompt token once per
    row), so the per-token readers take its output as it is, not a gather of the [tokens, vocab] logits."""
    mb = grouped_batch()
    shared = SharedPromptPacking(mb["attention_mask"], mb["input_ids"], RW)
    shared.keep_responses(RW)
    dev = torch.device("cpu")
    with torch.no_grad(), packed_rope(model, shared, dev), selected_outputs(model, shared, dev):
        out = model(shared.pack(mb["input_ids"]), None, None, packed_seq_params=shared.params(dev))
    tokens, valid = PackedOutput(out, shared).tokens(PW - 1, RW)
    assert tokens.data_ptr() == out.data_ptr() and len(tokens) == int(valid.sum()) == 20
