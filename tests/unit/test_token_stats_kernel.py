"""token_stats_kernel.py's Triton kernels (log-probs, entropy and their gradient, in one read of
the logits each way) against float64 log_softmax formulas. On CUDA when present; on CPU through
Triton's interpreter, in a subprocess started with TRITON_INTERPRET=1 (triton reads it when it is
first imported, so it cannot be switched on in this process), at tiny shapes with small vocabulary
chunks so that several chunks and a masked tail run. The kernel tests skip without triton."""

import pytest
import torch
from triton_kernels import HAS_TRITON, ONLY_WHERE_KERNEL_TESTS_SKIP, kernel_device, run_in_interpreter

N, V, BLOCK = 5, 1000, 256  # 4 chunks, the last one 232 wide


@pytest.fixture
def kernel():
    """(token_stats_triton, device)."""
    dev = kernel_device()
    from tandem.models.token_stats_kernel import token_stats_triton

    return token_stats_triton, dev


@ONLY_WHERE_KERNEL_TESTS_SKIP
def test_kernel_tests_in_the_interpreter():
    """This file's kernel tests on CPU, in a process started with TRITON_INTERPRET=1."""
    run_in_interpreter(__file__, "not in_the_interpreter and not cuda")


def reference(logits, labels, temperature):
    """(log-probs, entropy) in float64: what logprobs.py's log_probs_from_logits / entropy_from_logits
    compute (their megatron path at TP=1 is this log_softmax)."""
    logp = torch.log_softmax(logits.double() / temperature, -1)
    return logp.gather(-1, labels[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)


def inputs(dev, n=N, v=V, scale=3.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=g) * scale).to(dtype)
    labels = torch.randint(0, v, (n,), generator=g)
    w1, w2 = torch.randn(n, generator=g), torch.randn(n, generator=g)
    return logits.to(dev), labels.to(dev), w1.to(dev), w2.to(dev)


def grads(fn, logits, labels, w1, w2, temperature, entropy_grad, **kw):
    """(lp, ent, d/dlogits of sum(w1 lp) + sum(w2 ent)) of fn = the kernel or the reference."""
    x = logits.detach().clone().requires_grad_()
    if fn is reference:
        lp, ent = reference(x, labels, temperature)
        ent = ent if entropy_grad else ent.detach()
    else:
        lp, ent = fn(x, labels, 1.0 / temperature, True, entropy_grad, **kw)
        assert lp.dtype == ent.dtype == torch.float32 and ent.requires_grad == entropy_grad
    (w1.to(lp.dtype) * lp).sum().add((w2.to(ent.dtype) * ent).sum()).backward()
    assert x.grad.dtype == logits.dtype
    return lp.detach(), ent.detach(), x.grad


def close(a, b, tol, rel=0.0):
    err = (a.double() - b.double()).abs()
    ok = bool(torch.isfinite(a).all()) and bool((err <= tol + rel * b.double().abs()).all())
    assert ok, f"max |diff| {err.max().item():.3g} (tolerance {tol:g} + {rel:g} |ref|)"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_values_and_gradients_match_log_softmax(kernel, temperature, entropy_grad):
    fn, dev = kernel
    logits, labels, w1, w2 = inputs(dev)
    lp, ent, g = grads(fn, logits, labels, w1, w2, temperature, entropy_grad, block_v=BLOCK)
    rlp, rent, rg = grads(reference, logits, labels, w1, w2, temperature, entropy_grad)
    close(lp, rlp, 1e-5)
    close(ent, rent, 1e-5)
    close(g, rg, 1e-5)
    assert rg.abs().max() > 0.1  # the gradient is not trivially small


@pytest.mark.parametrize("v,block", [(1000, 256), (1024, 256), (100, 256), (1000, 1024), (1000, 4096)])
def test_vocabulary_not_a_multiple_of_the_chunk(kernel, v, block):
    """Several chunks with a masked tail, exact chunks, one partial chunk, one chunk > V."""
    fn, dev = kernel
    logits, labels, w1, w2 = inputs(dev, v=v, seed=1)
    labels[0] = v - 1  # a label in the tail
    lp, ent, g = grads(fn, logits, labels, w1, w2, 0.9, True, block_v=block)
    rlp, rent, rg = grads(reference, logits, labels, w1, w2, 0.9, True)
    close(lp, rlp, 1e-5)
    close(ent, rent, 1e-5)
    close(g, rg, 1e-5)


def test_log_probs_are_bitwise_the_same_whatever_the_flags(kernel):
    """The on-policy check: the no-grad log-prob pass (no entropy) and the update's forward (grad,
    entropy with or without its gradient) give the same bits."""
    fn, dev = kernel
    logits, labels, _, _ = inputs(dev, seed=2)
    with torch.no_grad():
        base, none = fn(logits, labels, 1 / 0.7, False, False, block_v=BLOCK)
        assert none is None
        no_grad_ent = fn(logits, labels, 1 / 0.7, True, False, block_v=BLOCK)
    x = logits.clone().requires_grad_()
    runs = [no_grad_ent, fn(x, labels, 1 / 0.7, False, False, block_v=BLOCK),
            fn(x, labels, 1 / 0.7, True, False, block_v=BLOCK), fn(x, labels, 1 / 0.7, True, True, block_v=BLOCK)]
    for lp, ent in runs:
        assert torch.equal(lp.detach(), base)
    assert torch.equal(runs[0][1], runs[3][1].detach())  # and the entropy with or without its gradient


def test_strided_rows(kernel):
    """A row stride that is not V (a view into wider rows), and a column stride that is not 1."""
    fn, dev = kernel
    logits, labels, w1, w2 = inputs(dev, seed=3)
    rlp, rent, rg = grads(reference, logits, labels, w1, w2, 0.8, True)
    wide = torch.zeros(N, V + 37, device=dev)
    wide[:, 13:13 + V] = logits
    wide.requires_grad_()
    view = wide[:, 13:13 + V]
    assert view.stride() == (V + 37, 1)
    lp, ent = fn(view, labels, 1 / 0.8, True, True, block_v=BLOCK)
    (w1 * lp + w2 * ent).sum().backward()
    close(lp.detach(), rlp, 1e-5)
    close(ent.detach(), rent, 1e-5)
    close(wide.grad[:, 13:13 + V], rg, 1e-5)
    assert (wide.grad[:, :13] == 0).all() and (wide.grad[:, 13 + V:] == 0).all()
    cols = logits.t().contiguous().requires_grad_()  # [V, N]: .t() has column stride N
    lp, ent = fn(cols.t(), labels, 1 / 0.8, True, True, block_v=BLOCK)
    (w1 * lp + w2 * ent).sum().backward()
    close(lp.detach(), rlp, 1e-5)
    close(cols.grad.t(), rg, 1e-5)


def test_no_rows(kernel):
    fn, dev = kernel
    x = torch.zeros(0, V, device=dev, requires_grad=True)
    lp, ent = fn(x, torch.zeros(0, dtype=torch.long, device=dev), 1.0, True, True, block_v=BLOCK)
    assert lp.shape == ent.shape == (0,)
    (lp.sum() + ent.sum()).backward()
    assert x.grad.shape == (0, V)


def test_extreme_logits_stay_finite(kernel):
    """Logits of +-1e4 scale (near one-hot softmax) and rows shifted by +-1e4. fp32's ulp at 1e4 is
    ~1e-3: z - lse is that precise there (in any fp32 implementation), and p = exp(z - lse) relatively
    so, hence the gradients' tolerance."""
    fn, dev = kernel
    logits, labels, w1, w2 = inputs(dev, scale=1e4, seed=4)
    lp, ent, g = grads(fn, logits, labels, w1, w2, 1.3, True, block_v=BLOCK)
    rlp, rent, rg = grads(reference, logits, labels, w1, w2, 1.3, True)
    close(lp, rlp, 1e-5, rel=1e-6)
    close(ent, rent, 1e-5)
    close(g, rg, 3e-3)
    logits, labels, w1, w2 = inputs(dev, seed=5)
    logits += torch.tensor([1e4, -1e4, 0.0, 5e3, -5e3], device=dev)[:, None]
    lp, ent, g = grads(fn, logits, labels, w1, w2, 1.0, True, block_v=BLOCK)
    rlp, rent, rg = grads(reference, logits, labels, w1, w2, 1.0, True)
    close(lp, rlp, 3e-3)
    close(ent, rent, 1e-4)
    close(g, rg, 3e-3)
    close(g[2], rg[2], 1e-5)  # the row that is not shifted


def test_out_of_range_label_gives_nan_not_a_bad_read(kernel):
    fn, dev = kernel
    logits, labels, _, _ = inputs(dev, seed=6)
    labels[1], labels[3] = V, -1
    lp, _ = fn(logits, labels, 1.0, False, False, block_v=BLOCK)
    assert lp[[1, 3]].isnan().all() and lp[[0, 2, 4]].isfinite().all()


def test_bf16_logits(kernel):
    """bf16 in, fp32 math, a bf16 gradient within bf16's rounding."""
    fn, dev = kernel
    logits, labels, w1, w2 = inputs(dev, seed=7, dtype=torch.bfloat16)
    lp, ent, g = grads(fn, logits, labels, w1, w2, 0.7, True, block_v=BLOCK)
    rlp, rent, rg = grads(reference, logits, labels, w1, w2, 0.7, True)
    close(lp, rlp, 1e-5)
    close(ent, rent, 1e-5)
    close(g, rg, 1e-4, rel=1e-2)


def test_arguments_are_checked(kernel):
    fn, dev = kernel
    logits, labels, _, _ = inputs(dev)
    with pytest.raises(ValueError, match="inv_t"):
        fn(logits, labels, 0.0, False)
    with pytest.raises(ValueError, match="labels"):
        fn(logits, labels[:3], 1.0, False)


@pytest.mark.skipif(not (HAS_TRITON and torch.cuda.is_available()), reason="token_stats takes the kernel on CUDA")
def test_token_stats_takes_the_kernel_on_cuda(monkeypatch):
    from tandem.models import logprobs
    from tandem.models.token_stats_kernel import token_stats_triton

    monkeypatch.setattr(logprobs, "_tp_size", lambda: 1)
    logits, labels, _, _ = inputs("cuda", n=64, v=151936, seed=8, dtype=torch.bfloat16)
    lp, ent = logprobs.token_stats(logits, labels, 0.7, True)
    klp, kent = token_stats_triton(logits, labels, 1 / 0.7, True)
    assert torch.equal(lp, klp) and torch.equal(ent, kent) and not ent.requires_grad
    rlp, rent = reference(logits, labels, 0.7)
    close(lp, rlp, 1e-4)
    close(ent, rent, 1e-4)
    assert logprobs.token_stats(logits, labels, 0.7, False)[1] is None
    with pytest.raises(ValueError, match="temperature"):
        logprobs.token_stats(logits, labels, 0.0, False)
