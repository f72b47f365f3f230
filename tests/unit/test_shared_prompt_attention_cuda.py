"""Shared-prompt attention's flash path (two varlen flash calls merged) against one SDPA over the packed
tokens with the same mask as a dense matrix, in float32: outputs and gradients, eager and compiled.
Needs a CUDA device (the CPU tests: test_shared_prompt_attention.py)."""
import pytest
import torch
from test_shared_prompt_attention import _allowed_by_index

from tandem.models.shared_prompt_attention import SharedPromptIndex, shared_prompt_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# two groups: a 150-token prompt with responses of 300, 1, 0 and 200 packed tokens; a 7-token prompt
# with one of 90; then a 5-token filler
PROMPTS, RESPONSES = [150, 7], [[300, 1, 0, 200], [90]]


def _index():
    segs, rs, rl, ps, pl, at = [], [], [], [], [], 0
    for p, rows in zip(PROMPTS, RESPONSES):
        start, at = at, at + p
        segs.append(p)
        for r in rows:
            segs.append(r)
            rs.append(at), rl.append(r), ps.append(start), pl.append(p)
            at += r
    return SharedPromptIndex.build(segs + [5], *map(torch.tensor, (rs, rl, ps, pl))), at + 5


@pytest.mark.parametrize("heads,groups,d", [(14, 2, 64), (12, 2, 128)])
@pytest.mark.parametrize("compiled", [False, True])
def test_merged_flash_equals_masked_sdpa(heads, groups, d, compiled):
    index, total = _index()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for h in (heads, groups, groups))
    scale = d ** -0.5
    fn = torch.compile(shared_prompt_attention, dynamic=True) if compiled else shared_prompt_attention
    out = fn(q, k, v, index.to(torch.device("cuda")), scale)
    mask = _allowed_by_index(index, total).cuda()
    want = torch.nn.functional.scaled_dot_product_attention(
        *(x.float().transpose(0, 1)[None] for x in (q, k, v)), attn_mask=mask, scale=scale,
        enable_gqa=True)[0].transpose(0, 1)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    dout = torch.randn(out.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref = torch.autograd.grad(want, (q, k, v), dout.float())
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2)
