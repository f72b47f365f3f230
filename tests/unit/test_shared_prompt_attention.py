"""Shared-prompt attention's flash path (tandem/models/shared_prompt_attention.py) on the CPU: its two
calls' masks together are the segment mask, and their merge (forward and backward) equals the padded
path's masked SDPA, with flash's two aten calls written out in float64 (tests/helpers/reference_flash.py).
The kernels themselves: tests/unit/test_shared_prompt_attention_cuda.py."""
import pytest
import reference_flash
import torch
from test_shared_prompts import RW, grouped_batch

from tandem.models import shared_prompt_attention as spa
from tandem.models.shared_prompts import SharedPromptPacking, segment_mask

HEADS, GROUPS, D = 4, 2, 8


def _packing(multiple=3):
    mb = grouped_batch()
    return SharedPromptPacking(mb["attention_mask"], mb["input_ids"], RW, multiple)


def _allowed_by_index(index: spa.SharedPromptIndex, total: int) -> torch.Tensor:
    allowed = torch.zeros(total, total, dtype=torch.bool)
    cu = index.cu_self.tolist()
    for a, b in zip(cu, cu[1:]):
        allowed[a:b, a:b] = torch.ones(b - a, b - a, dtype=torch.bool).tril()
    cq, ck = index.cu_query.tolist(), index.cu_key.tolist()
    for i in range(len(cq) - 1):
        allowed[index.query[cq[i]:cq[i + 1]][:, None], index.key[ck[i]:ck[i + 1]][None]] = True
    return allowed


def test_the_two_calls_cover_the_segment_mask():
    p = _packing()
    index = p.shared_index
    assert int(index.cu_self[-1]) == p.total and len(index.query) > 0
    # the padded path's mask, per sequence of cu_seqlens, laid into one [total, total] matrix
    want = torch.zeros(p.total, p.total, dtype=torch.bool)
    cu = p.cu_seqlens.tolist()
    seq = torch.repeat_interleave(torch.arange(len(cu) - 1), torch.tensor(cu[1:]) - torch.tensor(cu[:-1]))
    pos = torch.arange(p.total) - p.cu_seqlens[seq]
    masks = segment_mask(p.segments, (len(cu) - 1, p.max_seqlen), (seq, pos))[:, 0]
    for s, (a, b) in enumerate(zip(cu, cu[1:])):
        want[a:b, a:b] = masks[s, :b - a, :b - a]
    assert torch.equal(_allowed_by_index(index, p.total), want)
    assert index.max_self == int((index.cu_self[1:] - index.cu_self[:-1]).max())
    assert index.max_query == 3 and index.max_key == 5  # responses pack at most RW - 1 tokens; prompts 5


def test_merged_calls_equal_masked_sdpa(monkeypatch):
    from megatron.core.packed_seq_params import PackedSeqParams

    from tandem.models.attention import SDPAttention

    monkeypatch.setattr(spa, "_flash_forward", reference_flash.forward)
    monkeypatch.setattr(spa, "_flash_backward", reference_flash.backward)
    p = _packing()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(p.total, h, D, generator=g, dtype=torch.float64).requires_grad_()
               for h in (HEADS, GROUPS, GROUPS))
    att = SDPAttention.__new__(SDPAttention)
    att.heads_per_partition, att.groups_per_partition, att.softmax_scale = HEADS, GROUPS, 0.3
    params = p.params(torch.device("cpu"))
    assert isinstance(params, PackedSeqParams)
    want = att._packed(q, k, v, params).view(p.total, HEADS, D)  # the CPU path: one SDPA, segment mask
    got = spa.shared_prompt_attention(q, k, v, params.tandem_shared, 0.3)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    dout = torch.randn(got.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), dout), torch.autograd.grad(want, (q, k, v), dout)):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
        assert a.abs().sum() > 0


@pytest.mark.parametrize("case", ["no prompt sees a response", "one response"])
def test_build_edge_cases(case):
    """Responses without packed tokens or without a prompt get no cross-call sequence; zero-length
    segments are dropped from the first call's boundaries."""
    if case == "no prompt sees a response":
        index = spa.SharedPromptIndex.build([3, 0, 2], torch.tensor([3]), torch.tensor([0]), torch.tensor([0]),
                                            torch.tensor([3]))
        assert index.cu_self.tolist() == [0, 3, 5] and len(index.query) == 0 and index.cu_query.tolist() == [0]
        assert (index.max_query, index.max_key) == (0, 0)
    else:
        index = spa.SharedPromptIndex.build([2, 3], torch.tensor([2]), torch.tensor([3]), torch.tensor([0]),
                                            torch.tensor([2]))
        assert index.query.tolist() == [2, 3, 4] and index.key.tolist() == [0, 1]
        assert index.cu_query.tolist() == [0, 3] and index.cu_key.tolist() == [0, 2]
