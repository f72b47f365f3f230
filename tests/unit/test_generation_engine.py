"""The continuous-batching engine: refill, windows, shared prefill, the counter RNG and
the sampled distribution end to end (CPU, the same code path as the GPU minus graphs)."""

import pytest
import torch

from tandem.generation.engine import GenerationEngine
from tandem.generation.sampling import (
    SamplingParams,
    counter_uniform,
    filter_logits,
    sample_rows,
)
from tandem.models.forward import forward_logits

VOCAB, PAD, EOS = 32, 0, 1
PROMPTS = [[5, 9, 3, 17, 22, 8, 4], [7, 2], [30, 12, 6, 6], [3], [11, 25, 19, 2, 14, 27], [4, 4, 9]]
# chi-square upper-tail critical values at 0.001 (NIST/SEMATECH 1.3.6.7.4), by dof
CHI2_CRIT_0_001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322,
                   9: 27.877, 15: 37.697}


@pytest.fixture(scope="module")
def model(megatron_dist):
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape

    torch.manual_seed(0)
    shape = ModelShape(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                       init_std=0.3)
    return build_gpt_model(shape).eval()


def engine(model, **kw):
    return GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, **kw)


# Rows decoded in blocks of other sizes run the same fp32 operations in GEMMs of other shapes,
# whose kernels (and thread splits) sum in other orders: the same row's log-probs then differ
# by rounding only. Bound: a length-K fp32 dot product is within K * 2^-24 * sum|a_i b_i| of
# exact; here K <= 128, |logits| <= ~6, through ~6 chained GEMMs and a log-softmax:
# 128 * 6e-8 * 6 * 6 * 2 ~ 6e-4 (measured: 5e-6 .. 3.3e-5 across CPUs and thread counts).
# A logic error (a wrong position, cache slot or RNG counter) moves log-probs by > 1e-1,
# far outside it (test_the_row_tolerance_separates_bugs_from_rounding).
ROW_LOG_PROB_TOL = 1e-3


def same(a, b):
    assert torch.equal(a.responses, b.responses)
    assert torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.prompts, b.prompts)
    torch.testing.assert_close(a.rollout_log_probs, b.rollout_log_probs, atol=ROW_LOG_PROB_TOL, rtol=0)


@pytest.mark.parametrize("greedy", [True, False])
def test_refill_and_windows_do_not_change_rows(model, greedy):
    """3 slots for 12 rows (rows finish at different times and are refilled) and decode
    windows of 4 steps give the rows of one 12-slot block decoded step by step."""
    params = SamplingParams(max_new_tokens=9, temperature=0.8, top_k=8, n=2, seed=11, greedy=greedy)
    whole = engine(model, max_batch_size=64).generate(PROMPTS, params)
    lengths = whole.response_mask.sum(-1)
    assert lengths.min() < lengths.max(), "rows should finish at different steps"
    for kw in (dict(max_batch_size=3), dict(max_batch_size=5, sync_every=4), dict(max_batch_size=2)):
        same(engine(model, **kw).generate(PROMPTS, params), whole)


def test_the_row_tolerance_separates_bugs_from_rounding(model):
    """Control for ROW_LOG_PROB_TOL: the same tokens scored at another temperature (what a
    wrong row or position does to a log-prob, in size) differ by far more than it."""
    params = SamplingParams(max_new_tokens=9, temperature=0.8, top_k=8, n=2, seed=11)
    a = engine(model, max_batch_size=64).generate(PROMPTS, params)
    b = engine(model, max_batch_size=64).generate(PROMPTS, SamplingParams(
        max_new_tokens=9, temperature=0.8 * 1.1, top_k=8, n=2, seed=11))
    both = (a.response_mask * b.response_mask).bool()
    assert (a.rollout_log_probs - b.rollout_log_probs)[both].abs().max() > 100 * ROW_LOG_PROB_TOL


@pytest.mark.parametrize("attention", ["sdpa", "matmul"])
@torch.no_grad()
def test_greedy_with_refill_equals_full_recompute(model, attention):
    e = engine(model, max_batch_size=2, sync_every=3, decode_attention=attention)
    res = e.generate(PROMPTS, SamplingParams(max_new_tokens=8, greedy=True))
    for i, p in enumerate(PROMPTS):
        seq = list(p)
        n = int(res.response_mask[i].sum())
        for t in range(n):
            ids = torch.tensor([seq])
            logits = forward_logits(model, ids, torch.ones_like(ids))[0, -1].float()
            assert res.responses[i, t].item() == int(logits.argmax()), f"row {i} token {t}"
            lp = float(torch.log_softmax(logits, -1)[res.responses[i, t]])
            assert abs(res.rollout_log_probs[i, t].item() - lp) < 1e-5
            seq.append(int(logits.argmax()))
        assert n == 8 or seq[-1] == EOS


@pytest.mark.parametrize("kv_bucket", [16, 32])
def test_cpu_kv_bucket_gives_the_same_bits_as_128(model, kv_bucket):
    """CPU decode attends over the cache rounded up to 16 positions (the default without graphs),
    not 128: a multiple of the vector width only adds masked positions, whose zeros leave every
    sum as it was. Tokens and log-probs are equal bit for bit (sampling consumes the bits)."""
    params = SamplingParams(max_new_tokens=9, temperature=0.8, n=4, seed=5)
    assert engine(model).kv_bucket == 16  # no CUDA graphs here
    wide = engine(model, kv_bucket=128).generate(PROMPTS, params)
    narrow = engine(model, kv_bucket=kv_bucket).generate(PROMPTS, params)
    for field in ("responses", "response_mask", "rollout_log_probs"):
        assert torch.equal(getattr(narrow, field), getattr(wide, field)), field


def test_engine_is_reused_across_calls_and_sizes(model):
    e = engine(model, max_batch_size=4)
    params = SamplingParams(max_new_tokens=5, n=2, seed=3)
    a = e.generate(PROMPTS[:2], params)
    big = e.generate(PROMPTS, SamplingParams(max_new_tokens=20, n=2, seed=3))  # grows the cache
    assert big.responses.shape == (12, 20)
    same(e.generate(PROMPTS[:2], params), a)
    same(engine(model, max_batch_size=4).generate(PROMPTS[:2], params), a)


def test_n_samples_share_the_prompt_and_differ(model):
    res = engine(model).generate([PROMPTS[0]], SamplingParams(max_new_tokens=6, n=8, seed=2))
    assert len({tuple(r) for r in res.responses.tolist()}) > 4
    assert (res.prompts == res.prompts[0]).all()


def test_counter_uniform_is_deterministic_and_uniform():
    rows = torch.arange(20_000)
    u = counter_uniform(torch.tensor(7), rows, torch.tensor(3))
    assert torch.equal(u, counter_uniform(torch.tensor(7), rows, torch.tensor(3)))
    assert not torch.equal(u, counter_uniform(torch.tensor(8), rows, torch.tensor(3)))
    assert not torch.equal(u, counter_uniform(torch.tensor(7), rows, torch.tensor(4)))
    assert u.dtype == torch.float32 and 0 < u.min() and u.max() < 1
    counts = torch.histc(u, bins=16, min=0, max=1).tolist()
    stat = sum((c - len(rows) / 16) ** 2 / (len(rows) / 16) for c in counts)
    assert stat < CHI2_CRIT_0_001[15], counts


def _chi2(counts, probs):
    total = sum(counts)
    return sum((c - total * p) ** 2 / (total * p) for c, p in zip(counts, probs))


@pytest.mark.parametrize("top_k,top_p", [(5, 0.95), (0, 0.9), (0, 1.0)])
def test_sample_rows_frequencies_match_filtered_softmax(top_k, top_p):
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    draws, temperature = 40_000, 0.7
    expected = torch.softmax(filter_logits(logits[None] / temperature, top_k, top_p), -1)[0]
    keep = (expected > 0).nonzero().squeeze(-1).tolist()
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    rows = torch.arange(draws)
    tokens, logp = sample_rows(logits.expand(draws, -1).clone(), params, torch.tensor(2024), rows,
                               torch.zeros_like(rows))
    counts = torch.bincount(tokens, minlength=8)
    assert counts[[i for i in range(8) if i not in keep]].sum() == 0
    stat = _chi2(counts[keep].tolist(), expected[keep].tolist())
    assert stat < CHI2_CRIT_0_001[len(keep) - 1], (stat, counts.tolist(), expected.tolist())
    full = torch.log_softmax(logits / temperature, -1)
    assert torch.allclose(logp, full[tokens], atol=1e-6)


@torch.no_grad()
def test_engine_first_token_frequencies_match_model_softmax(model):
    """End to end: 4000 samples of one prompt (one shared prefill) against the model's
    own next-token distribution at T=0.7 with top-k and top-p."""
    prompt = PROMPTS[4]
    temperature, top_k, top_p, n = 0.7, 6, 0.9, 4000
    ids = torch.tensor([prompt])
    logits = forward_logits(model, ids, torch.ones_like(ids))[0, -1].float()
    expected = torch.softmax(filter_logits(logits[None] / temperature, top_k, top_p), -1)[0]
    keep = (expected > 0).nonzero().squeeze(-1).tolist()
    assert 3 <= len(keep) <= top_k, f"the filters should matter: {expected}"
    res = engine(model, max_batch_size=n).generate(
        [prompt], SamplingParams(max_new_tokens=1, temperature=temperature, top_k=top_k,
                                 top_p=top_p, n=n, seed=99))
    counts = torch.bincount(res.responses[:, 0], minlength=VOCAB)
    assert counts[[i for i in range(VOCAB) if i not in keep]].sum() == 0
    stat = _chi2(counts[keep].tolist(), expected[keep].tolist())
    assert stat < CHI2_CRIT_0_001[len(keep) - 1], (stat, counts[keep].tolist(), expected[keep].tolist())
    full = torch.log_softmax(logits / temperature, -1)
    torch.testing.assert_close(res.rollout_log_probs[:, 0], full[res.responses[:, 0]], atol=1e-5, rtol=0)


def test_two_level_inverse_cdf_on_a_long_vocabulary():
    """Vocabularies longer than two blocks pick a block by its mass, then a token inside it:
    the same draws as one cumsum over the row, and never a zero-probability token."""
    from tandem.generation.sampling import _inverse_cdf, _search

    g = torch.Generator().manual_seed(0)
    v = 10_000  # 4 full blocks of 2048 and a partial one
    probs = torch.rand(64, v, generator=g) ** 8
    probs[:, ::3] = 0.0  # filtered tokens
    probs[:, 9_000:] = 0.0  # an empty tail, incl. the partial block
    u = torch.rand(64, generator=g)
    two = _inverse_cdf(probs, u)
    one = _search(probs, u * probs.sum(-1))
    assert (two == one).float().mean() > 0.95 and (probs.gather(-1, two[:, None]) > 0).all()
    assert (probs.gather(-1, _inverse_cdf(probs, torch.full((64,), 1 - 2**-24))[:, None]) > 0).all()
    # frequencies: mass on 5 tokens in different blocks (one in the partial block)
    hot = [5, 3001, 4100, 7000, 9999]
    weights = torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15])
    row = torch.zeros(v)
    row[hot] = weights
    draws = 40_000
    u = counter_uniform(torch.tensor(3), torch.arange(draws), torch.tensor(0))
    tokens = _inverse_cdf(row.expand(draws, -1), u)
    counts = torch.bincount(tokens, minlength=v)
    assert counts[hot].sum() == draws
    stat = _chi2(counts[hot].tolist(), weights.tolist())
    assert stat < CHI2_CRIT_0_001[4], (stat, counts[hot].tolist())


def test_one_pass_draw_on_a_long_vocabulary():
    """_draw_full (the unfiltered sampler: block maxima and masses from one read of the
    logits) draws what softmax + _inverse_cdf draws, returns logsumexp, and its tokens
    follow the softmax (hot tokens in different blocks, one in the partial last block)."""
    from tandem.generation.sampling import _draw_full, _inverse_cdf

    g = torch.Generator().manual_seed(1)
    v = 5_000  # 2 full blocks of 2048 and a partial one
    z = torch.randn(512, v, generator=g) * 4
    u = torch.rand(512, generator=g)
    tokens, lse = _draw_full(z, u)
    assert (tokens == _inverse_cdf(torch.softmax(z, -1), u)).float().mean() > 0.99
    torch.testing.assert_close(lse, torch.logsumexp(z, -1), atol=1e-5, rtol=0)
    hot = [5, 3001, 4100, 4999]
    weights = torch.tensor([0.1, 0.4, 0.25, 0.25])
    row = torch.full((v,), -40.0)
    row[hot] = weights.log()
    draws = 10_000
    u = counter_uniform(torch.tensor(3), torch.arange(draws), torch.tensor(0))
    tokens, _ = _draw_full(row.expand(draws, -1), u)
    counts = torch.bincount(tokens, minlength=v)
    assert counts[hot].sum() >= draws - 1  # the other 4,996 tokens hold ~2e-14 of the mass
    stat = _chi2(counts[hot].tolist(), weights.tolist())
    assert stat < CHI2_CRIT_0_001[3], (stat, counts[hot].tolist())
