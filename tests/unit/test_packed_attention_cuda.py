"""Packed attention's GPU path (varlen flash attention through the aten op) against its
padded-SDPA path: same outputs and gradients, eager and compiled. Needs a CUDA device."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _inputs(seqlens, heads=8, groups=2, d=64):
    g = torch.Generator(device="cuda").manual_seed(0)
    t = sum(seqlens)
    q, k, v = (torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for h in (heads, groups, groups))
    cu = torch.tensor([0, *seqlens], dtype=torch.int32).cumsum(0, dtype=torch.int32).cuda()
    return q, k, v, cu


def _padded(q, k, v, cu, seqlens, scale):
    """The CPU path's arithmetic: sequences right-padded, one causal SDPA."""
    outs = []
    for i, n in enumerate(seqlens):
        s = slice(int(cu[i]), int(cu[i]) + n)
        o = torch.nn.functional.scaled_dot_product_attention(
            *(x[s].transpose(0, 1)[None] for x in (q, k, v)), is_causal=True, scale=scale, enable_gqa=True)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("compiled", [False, True])
def test_flash_varlen_equals_padded_sdpa(compiled):
    from tandem.models.attention import _varlen_attn

    assert _varlen_attn is not None
    seqlens, scale = [37, 300, 5, 129], 0.11
    q, k, v, cu = _inputs(seqlens)
    fn = torch.compile(_varlen_attn, dynamic=True) if compiled else _varlen_attn
    out = fn(q, k, v, cu, max(seqlens), scale)
    want = _padded(q, k, v, cu, seqlens, scale)
    assert out.shape == (sum(seqlens), 8, 64)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    ref = torch.autograd.grad(want, (q, k, v), grad)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def test_fp32_on_a_gpu_takes_the_padded_path():
    """Flash attention takes fp16 / bf16 only: an fp32 model on a GPU attends through padded SDPA."""
    from megatron.core.packed_seq_params import PackedSeqParams

    from tandem.models.attention import SDPAttention

    seqlens = [7, 30, 12]
    q, k, v, cu = (x.detach().float() if x.is_floating_point() else x for x in _inputs(seqlens))
    att = SDPAttention.__new__(SDPAttention)
    att.heads_per_partition, att.groups_per_partition, att.softmax_scale = 8, 2, 0.125
    params = PackedSeqParams(qkv_format="thd", max_seqlen_q=max(seqlens), max_seqlen_kv=max(seqlens))
    params.tandem_cu_seqlens = cu
    seq = torch.repeat_interleave(torch.arange(3), torch.tensor(seqlens))
    pos = torch.cat([torch.arange(n) for n in seqlens])
    params.tandem_pad_index = (seq, pos)
    out = att._packed(q, k, v, params)
    torch.testing.assert_close(out.view(-1, 8, 64), _padded(q, k, v, cu, seqlens, 0.125), atol=1e-4, rtol=1e-4)
