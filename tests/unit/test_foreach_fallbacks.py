"""The foreach kernels that replace megatron's one-tensor-at-a-time optimizer fallbacks
compute what those fallbacks compute, and an optimizer step through them equals one
through the loops."""
import pytest
import torch

from tandem.train import foreach_fallbacks


def _tensors(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*s, generator=g).to(dtype) for s in ((7, 3), (11,), (2, 5, 4), (1,))]


def test_l2_norm_matches_megatron_loop(megatron_dist):
    from megatron.core.utils import local_multi_tensor_l2_norm

    ts = _tensors()
    flag = torch.zeros(1, dtype=torch.int)
    ours, _ = foreach_fallbacks.l2_norm(2048, flag, [ts], False)
    theirs, _ = local_multi_tensor_l2_norm(2048, flag, [ts], False)
    assert ours.shape == theirs.shape == (1,) and ours.dtype == torch.float32
    assert torch.allclose(ours, theirs, rtol=1e-6)
    assert float(foreach_fallbacks.l2_norm(2048, flag, [[]], False)[0]) == 0.0


@pytest.mark.parametrize("factor", [1.0, 0.25])
def test_scale_and_copy_match_megatron_loop(megatron_dist, factor):
    from megatron.core.utils import local_multi_tensor_scale

    src = _tensors()
    ours, theirs = _tensors(torch.bfloat16), _tensors(torch.bfloat16)
    foreach_fallbacks.scale(2048, None, [src, ours], factor)
    local_multi_tensor_scale(2048, None, [src, theirs], factor)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    inplace, expected = _tensors(), [t * factor for t in _tensors()]
    foreach_fallbacks.scale(2048, None, [inplace, inplace], factor)  # clipping: grads scaled in place
    assert all(torch.equal(a, b) for a, b in zip(inplace, expected))
    dst = _tensors(torch.bfloat16)
    foreach_fallbacks.copy_this_to_that(src, dst)
    assert all(torch.equal(d, s.to(torch.bfloat16)) for d, s in zip(dst, src))


def _update(install: bool):
    """One clipped Adam step; -> the new weights and the grad norm. (fp32: megatron's bf16
    optimizer refuses CPU tensors, so the main-weight copy is only tested directly above.)"""
    from tandem.config import OptimConfig
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape
    from tandem.train.optim import Optimizer, wrap_ddp

    install_was = foreach_fallbacks.install
    if not install:  # megatron's loops: nothing swapped, and Optimizer must not swap them
        foreach_fallbacks.uninstall()
        foreach_fallbacks.install = lambda: False
    try:
        torch.manual_seed(0)
        model = build_gpt_model(ModelShape(vocab_size=32, hidden_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1, intermediate_size=64))
        ddp = wrap_ddp(model)
        opt = Optimizer(ddp, OptimConfig(lr=1e-2, clip_grad=1e-3))  # small clip: the norm sets the step
        opt.zero_grad()
        ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
        ddp(ids, None, None).float().pow(2).mean().backward()
        from megatron.core.optimizer import clip_grads
        assert (clip_grads.l2_norm_impl is foreach_fallbacks.l2_norm) == install  # what the step used
        norm = opt.step()
        return {n: p.detach().clone() for n, p in model.named_parameters()}, norm
    finally:
        foreach_fallbacks.install = install_was


def test_optimizer_step_through_foreach_equals_loops(megatron_dist):
    loops, loops_norm = _update(install=False)
    ours, ours_norm = _update(install=True)  # Optimizer installed them (no TE / Apex here)
    assert ours_norm == pytest.approx(loops_norm, rel=1e-6) and ours_norm > 1e-3
    for name, w in loops.items():
        assert torch.equal(w, ours[name]), name
