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
    assert p.index(3, 3)[1].tolist() == [9, 10, 11]
    assert p.positions.tolist() == [*range(9), *range(3), *range(6), *range(3), *range(3)]  # restart per sequence


@torch.no_grad()
def test_packed_forward_equals_padded(model):
    ids, mask = padded_batch()
    padded = forward_logits(model, ids, mask)  # [B, T, V], 4D padding mask
    p = Packing(mask, multiple=3)  # with a filler sequence
    with packed_rope(model, p, ids.device):  # one angle row per packed token, not megatron's per-sequence loop
        assert model.rotary_pos_emb(p.max_seqlen).shape[:2] == (p.total, 1)
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
