"""Packed (padding-free, THD) micro-batches against the padded layout with a 4D mask:
same outputs at every real position, and clear errors for masks that cannot be packed."""
import pytest
import torch

from tandem.models.forward import forward_logits
from tandem.models.packing import PackedOutput, Packing, packed_rope, take_positions

VOCAB = 32
# [left-padded prompt (width 5) | right-padded response (width 4)]
PROMPT_LENS, RESPONSE_LENS = [5, 2, 3, 1], [4, 1, 3, 2]


def padded_batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, VOCAB, (4, 9), generator=g)
    mask = torch.zeros(4, 9, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        mask[i, 5 - p: 5 + r] = 1
    return torch.where(mask.bool(), ids, 0), mask


@pytest.fixture(scope="module")
def model(megatron_dist):
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape

    torch.manual_seed(0)
    shape = ModelShape(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64, init_std=0.3)
    return build_gpt_model(shape).eval()


def test_packing_layout():
    ids, mask = padded_batch()
    p = Packing(mask, multiple=4)
    assert p.total == 21 + 3 and p.filler == 3  # 21 real tokens, padded to a multiple of 4
    assert p.cu_seqlens.tolist() == [0, 9, 12, 18, 21, 24]
    packed = p.pack(ids)[0]
    assert packed[:21].tolist() == ids[mask.bool()].tolist()  # row-major real tokens, nothing else
    # row 1: prompt at padded positions 3..4, response at 5; its first real token is packed index 9
    assert p.index_valid(3, 3)[0][1].tolist() == [9, 10, 11]
    assert p.positions.tolist() == [*range(9), *range(3), *range(6), *range(3), *range(3)]  # restart per sequence


@torch.no_grad()
def test_packed_forward_equals_padded(model):
    ids, mask = padded_batch()
    padded = forward_logits(model, ids, mask)  # [B, T, V], 4D padding mask
    p = Packing(mask, multiple=3)  # with a filler sequence
    with packed_rope(model, p, ids.device):  # one angle row per packed token, not megatron's per-sequence loop
        assert model.rotary_pos_emb(p.max_seqlen).shape == (p.total, 1, 2 * 16)  # cos / sin (tandem/models/rope_table.py)
        out = PackedOutput(model(p.pack(ids), None, None, packed_seq_params=p.params(ids.device)), p)
    got = take_positions(out, 0, 9)
    real = mask.bool()
    assert (padded[real] - got[real]).abs().max() < 1e-5
    assert padded[real].std() > 0.1  # a model whose outputs differ by position and row


def test_unpackable_masks_are_refused():
    with pytest.raises(ValueError, match="no real tokens"):
        Packing(torch.tensor([[1, 1, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="contiguous"):
        Packing(torch.tensor([[1, 0, 1], [1, 1, 1]]))


def _response_batch():
    from tandem.data.batch import DataProto

    ids, mask = padded_batch()
    return DataProto(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, 5:],
                              "response_mask": mask[:, 5:]})


def _packed_log_probs(model, mb, keep: bool):
    from tandem.models.packing import selected_outputs
    from tandem.train.losses import response_log_probs

    p = Packing(mb["attention_mask"], multiple=3)
    if keep:
        p.keep_responses(mb["responses"].shape[1])
    with packed_rope(model, p, torch.device("cpu")), selected_outputs(model, p, torch.device("cpu")):
        out = model(p.pack(mb["input_ids"]), None, None, packed_seq_params=p.params(torch.device("cpu")))
    return PackedOutput(out, p), response_log_probs(PackedOutput(out, p), mb, 0.7, with_entropy=True,
                                                    entropy_grad=True)


def test_lm_head_on_response_positions_only(model):
    """The LM head on the kept (response-predicting) positions only gives the padded layout's
    log-probs and entropies, and the same gradients as the head on every position."""
    from tandem.train.losses import response_log_probs

    mb = _response_batch()
    rmask = mb["response_mask"].bool()
    with torch.no_grad():
        padded = response_log_probs(forward_logits(model, mb["input_ids"], mb["attention_mask"]), mb, 0.7, True)
    grads = []
    for keep in (False, True):
        model.zero_grad(set_to_none=True)
        out, (lp, ent) = _packed_log_probs(model, mb, keep)
        assert (lp[rmask] - padded[0][rmask]).abs().max() < 1e-5
        assert (ent[rmask] - padded[1][rmask]).abs().max() < 1e-5
        ((lp - 0.1 * ent) * rmask).sum().backward()
        grads.append({n: q.grad.clone() for n, q in model.named_parameters()})
        if keep:
            assert out.output.shape[1] == int(rmask.sum()) == 10  # not the 21 real tokens
            assert (lp[~rmask] == 0).all()
            with pytest.raises(ValueError, match="response positions only"):
                out.take(0, 9)  # prompt positions were not computed
    for name, g in grads[0].items():
        assert (g - grads[1][name]).abs().max() < 1e-5, name
    assert sum(g.abs().sum() for g in grads[1].values()) > 0


def test_the_tp_general_token_stats_are_log_softmax(megatron_dist):
    """The TP-general path (megatron's vocab-parallel cross entropy, the entropy with its all-reduces)
    computes log_softmax's log-prob and entropy, values and gradients: the float64 formulas the GPU
    kernels are checked against (tests/unit/test_token_stats_kernel.py)."""
    from tandem.models import logprobs

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(7, 50, generator=g) * 3).requires_grad_()
    labels = torch.randint(0, 50, (7,), generator=g)
    w = torch.randn(7, generator=g)
    logp = torch.log_softmax(logits.double() / 0.7, -1)
    lp, ent = logp.gather(-1, labels[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)
    ((lp + 0.3 * ent) * w).sum().backward()
    want_grad, logits.grad = logits.grad, None
    ref_lp = logprobs.log_probs_from_logits(logits, labels, 0.7)
    ref_ent = logprobs.entropy_from_logits(logits, 0.7)
    ((ref_lp + 0.3 * ref_ent) * w).sum().backward()
    assert (lp - ref_lp).abs().max() < 1e-5 and (ent - ref_ent).abs().max() < 1e-5
    assert (want_grad - logits.grad).abs().max() < 1e-5


def test_gqa_head_expansion_is_repeat_interleave():
    from tandem.models.attention import _expand_heads

    t = torch.randn(5, 2, 3)
    assert torch.equal(_expand_heads(t, 6), t.repeat_interleave(3, dim=1))
