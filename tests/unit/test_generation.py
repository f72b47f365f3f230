"""GenerationEngine (KV-cached batched decoding) against full recomputation, rollout
log-probs against the actor's recomputed log-probs, and the sampling distribution."""
import math

import pytest
import torch

from tandem.data.batch import DataProto
from tandem.generation.engine import GenerationEngine, left_pad
from tandem.generation.sampling import SamplingParams, filter_logits, sample
from tandem.models.forward import forward_logits

VOCAB, PAD, EOS = 32, 0, 1
# prompts of different lengths: the engine left-pads them into one block
PROMPTS = [[5, 9, 3, 17, 22, 8, 4], [7, 2], [30, 12, 6, 6], [3], [11, 25, 19, 2, 14, 27]]


@pytest.fixture(scope="module")
def model(megatron_dist):
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape

    torch.manual_seed(0)
    shape = ModelShape(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                       init_std=0.3)  # large init: peaked, prompt-dependent next-token distributions
    return build_gpt_model(shape).eval()


def engine(model, max_batch_size=64):
    return GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, max_batch_size=max_batch_size)


@torch.no_grad()
def greedy_by_recompute(model, prompt, max_new, stop_ids):
    """Reference decoding: the whole sequence through the model at every step, no cache."""
    seq, toks, lps = list(prompt), [], []
    for _ in range(max_new):
        ids = torch.tensor([seq])
        logits = forward_logits(model, ids, torch.ones_like(ids))[0, -1].float()
        tok = int(logits.argmax())
        toks.append(tok)
        lps.append(float(torch.log_softmax(logits, -1)[tok]))
        seq.append(tok)
        if tok in stop_ids:
            break
    return toks, lps


def test_greedy_equals_full_recompute_with_left_padding(model):
    max_new = 10
    res = engine(model).generate(PROMPTS, SamplingParams(max_new_tokens=max_new, greedy=True))
    assert res.responses.shape == (len(PROMPTS), max_new)
    assert res.prompts.shape == (len(PROMPTS), max(len(p) for p in PROMPTS))
    for i, p in enumerate(PROMPTS):
        # left padding: the prompt is right-aligned, pad before it
        width = res.prompts.shape[1]
        assert res.prompts[i, width - len(p):].tolist() == p
        assert res.prompt_mask[i].tolist() == [0] * (width - len(p)) + [1] * len(p)
        toks, lps = greedy_by_recompute(model, p, max_new, {EOS})
        n = int(res.response_mask[i].sum())
        assert res.responses[i, :n].tolist() == toks, f"row {i}"
        assert res.response_mask[i].tolist() == [1] * n + [0] * (max_new - n)
        assert (res.responses[i, n:] == PAD).all()
        torch.testing.assert_close(res.rollout_log_probs[i, :n], torch.tensor(lps), atol=1e-5, rtol=0)
        assert (res.rollout_log_probs[i, n:] == 0).all()
    # the test is not trivial: the rows decode different continuations
    assert len({tuple(r) for r in res.responses.tolist()}) == len(PROMPTS)


def test_chunked_generation_equals_one_block(model):
    params = SamplingParams(max_new_tokens=6, greedy=True)
    whole = engine(model).generate(PROMPTS, params)
    chunked = engine(model, max_batch_size=2).generate(PROMPTS, params)
    assert torch.equal(whole.responses, chunked.responses)
    assert torch.equal(whole.response_mask, chunked.response_mask)
    assert torch.equal(whole.prompts, chunked.prompts)
    torch.testing.assert_close(whole.rollout_log_probs, chunked.rollout_log_probs, atol=1e-5, rtol=0)


# ---- rollout log-probs == actor's recomputed log-probs --------------------------------

@pytest.fixture(scope="module")
def actor(megatron_dist, arithmetic_tokenizer):
    from tandem.config import load_config
    from tandem.services.actor.worker import ActorWorker

    cfg = load_config(None, [
        f"actor_rollout_ref.model.tokenizer_path={arithmetic_tokenizer.name_or_path}",
        "actor_rollout_ref.model.init_std=0.3",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5"])  # several uneven micro-batches
    return ActorWorker(cfg, len(arithmetic_tokenizer))


def arithmetic_prompts(tokenizer, texts):
    rows = [[tokenizer.bos_token_id] + tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    return DataProto(tensors={"input_ids": ids, "attention_mask": mask})


def test_rollout_log_probs_equal_actor_recomputed(actor, arithmetic_tokenizer):
    from tandem.rollout.worker import RolloutWorker

    tok = arithmetic_tokenizer
    rollout = RolloutWorker(actor.policy, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id,
                            vocab_size=actor.vocab_size, max_batch_size=64)
    prompts = arithmetic_prompts(tok, ["12+7=", "905+88=", "3+4=", "640+521="])
    params = SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9, top_k=5, n=3, seed=1234)
    gen = rollout.generate_sequences(prompts, params)
    assert len(gen) == 12 and gen.meta["temperature"] == 0.7 and gen.meta["rollout_n"] == 3
    # prompt-major rows: p0 s0, p0 s1, p0 s2, p1 s0, ...
    assert torch.equal(gen["prompts"][0], gen["prompts"][2]) and not torch.equal(gen["prompts"][0], gen["prompts"][3])

    seq = gen.select(tensor_keys=["input_ids", "attention_mask", "responses", "response_mask"])
    old = actor_log_probs(actor, seq, gen.meta["temperature"])
    mask = gen["response_mask"].bool()
    assert old.shape == mask.shape and old.dtype == torch.float32
    diff = (old - gen["rollout_log_probs"])[mask].abs().max().item()
    # fp32: the actor's packed per-sequence attention and the engine's cached decode sum in
    # different orders (observed up to 1.3e-5 at T = 0.7); a wrong position or mask gives > 1e-2
    assert diff < 5e-5, f"max |actor - rollout| log-prob difference {diff}"
    # not a trivial agreement: sampled (not argmax-only) tokens with varied log-probs
    chosen = gen["rollout_log_probs"][mask]
    assert chosen.std() > 0.05 and (chosen < -0.05).any()
    assert len({tuple(r) for r in gen["responses"].tolist()}) > 3
    # the same batch at another temperature gives other log-probs: the meta is honoured
    assert (actor_log_probs(actor, seq, 1.0) - old)[mask].abs().max() > 1e-3


def actor_log_probs(actor, seq, temperature):
    """The actor's recomputed log-probs of the responses (either ActorWorker API)."""
    if hasattr(actor, "compute_log_prob"):
        seq.meta = {"temperature": temperature, "rollout_n": 3}
        return actor.compute_log_prob(seq)["old_log_probs"]
    return actor.log_probs([seq], "policy", temperature, False, 5)[0]["log_probs"]


# ---- sampling ---------------------------------------------------------------------------

def test_seeded_sampling_is_reproducible(model):
    e = engine(model)
    params = dict(max_new_tokens=8, temperature=1.0, n=4)
    a = e.generate(PROMPTS, SamplingParams(seed=5, **params))
    b = e.generate(PROMPTS, SamplingParams(seed=5, **params))
    c = e.generate(PROMPTS, SamplingParams(seed=6, **params))
    assert torch.equal(a.responses, b.responses) and torch.equal(a.rollout_log_probs, b.rollout_log_probs)
    assert not torch.equal(a.responses, c.responses)
    assert len({tuple(r) for r in a.responses.tolist()}) > len(PROMPTS)  # n samples of a prompt differ


def test_top_k_1_equals_greedy(model):
    e = engine(model)
    greedy = e.generate(PROMPTS, SamplingParams(max_new_tokens=8, greedy=True))
    top1 = e.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=1.0, top_k=1, seed=3))
    assert torch.equal(greedy.responses, top1.responses)
    assert torch.equal(greedy.response_mask, top1.response_mask)
    torch.testing.assert_close(greedy.rollout_log_probs, top1.rollout_log_probs, atol=1e-6, rtol=0)


def test_filter_logits_by_hand():
    inf = float("-inf")
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    # softmax of [3, 2, 1, 0] (sorted) = 0.644, 0.237, 0.087, 0.032; mass before = 0, .644, .881, .968
    assert filter_logits(logits, top_k=2, top_p=1.0).tolist() == [[inf, 3.0, 2.0, inf]]
    assert filter_logits(logits, top_k=0, top_p=0.6).tolist() == [[inf, 3.0, inf, inf]]
    assert filter_logits(logits, top_k=0, top_p=0.7).tolist() == [[inf, 3.0, 2.0, inf]]
    assert filter_logits(logits, top_k=0, top_p=0.9).tolist() == [[1.0, 3.0, 2.0, inf]]
    assert filter_logits(logits, top_k=0, top_p=1.0).tolist() == logits.tolist()
    assert filter_logits(logits, top_k=4, top_p=1.0).tolist() == logits.tolist()
    # top-k first, then top-p on the renormalised survivors: [3, 2, 1] -> .665, .245, .090,
    # mass before = 0, .665, .910: with top-k 3, top-p 0.9 now drops the third token too
    assert filter_logits(logits, top_k=3, top_p=0.95).tolist() == [[1.0, 3.0, 2.0, inf]]
    assert filter_logits(logits, top_k=3, top_p=0.9).tolist() == [[inf, 3.0, 2.0, inf]]
    # rows are independent
    two = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 0.0]])
    assert filter_logits(two, top_k=0, top_p=0.7).tolist() == [[inf, 3.0, 2.0, inf], [inf, inf, 5.0, inf]]


def test_stop_tokens_end_rows_and_are_in_response_mask(model):
    e = engine(model)
    max_new = 10
    free = e.generate(PROMPTS, SamplingParams(max_new_tokens=max_new, greedy=True))
    # a stop token that some row emits after its first token
    lengths = free.response_mask.sum(-1).tolist()
    candidates = [t for i, row in enumerate(free.responses.tolist()) for t in row[1:lengths[i]] if t != EOS]
    assert candidates, "greedy rows are too short to pick a stop token"
    stop = max(set(candidates), key=candidates.count)
    out = e.generate(PROMPTS, SamplingParams(max_new_tokens=max_new, greedy=True, stop_token_ids=[stop]))
    stopped_rows = 0
    for i, row in enumerate(free.responses.tolist()):
        row = row[:lengths[i]]
        n = row.index(stop) + 1 if stop in row else lengths[i]
        stopped_rows += stop in row
        assert out.responses[i, :n].tolist() == row[:n]
        assert out.response_mask[i].tolist() == [1] * n + [0] * (max_new - n)  # includes the stop token
        assert (out.responses[i, n:] == PAD).all() and (out.rollout_log_probs[i, n:] == 0).all()
        if stop in row:
            assert out.responses[i, n - 1].item() == stop
    assert stopped_rows >= 1


# Chi-square critical values at significance 0.001 (upper tail), by degrees of freedom
# (standard tables, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.4). scipy is not installed.
CHI2_CRIT_0_001 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}


def _chi2(counts: list[int], probs: list[float]) -> float:
    total = sum(counts)
    return sum((c - total * p) ** 2 / (total * p) for c, p in zip(counts, probs))


def test_sampled_frequencies_match_filtered_softmax():
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    temperature, top_k, top_p, draws = 0.7, 5, 0.95, 40_000
    # Expected distribution, computed by hand here (not with filter_logits):
    # z = logits / T; top-5 keeps tokens 0..4; their softmax is .525 .257 .126 .062 .030
    # with mass-before 0, .525, .782, .908, .970: top-p 0.95 drops token 4 (.970 >= .95).
    z = [x / temperature for x in logits.tolist()]
    top5 = [math.exp(v) for v in z[:5]]
    p5 = [v / sum(top5) for v in top5]
    before = [sum(p5[:i]) for i in range(5)]
    keep = [i for i in range(5) if before[i] < top_p]
    assert keep == [0, 1, 2, 3]  # both filters are active in this example
    kept = [math.exp(z[i]) for i in keep]
    expected = [v / sum(kept) for v in kept]

    gen = torch.Generator().manual_seed(2024)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    tokens, logp = sample(logits.expand(draws, -1).clone(), params, gen)
    counts = torch.bincount(tokens, minlength=8).tolist()
    assert sum(counts[4:]) == 0, f"filtered tokens were sampled: {counts}"
    stat = _chi2(counts[:4], expected)
    crit = CHI2_CRIT_0_001[len(keep) - 1]  # df = 3
    assert stat < crit, f"chi2={stat:.2f} >= {crit} (df=3); counts {counts[:4]}, expected {expected}"
    # the test has power: the same counts reject the unfiltered T=0.7 softmax (all 8 tokens)
    # and the filtered distribution at the wrong temperature (T=1)
    unfiltered = torch.softmax(logits / temperature, -1).tolist()
    assert _chi2(counts, unfiltered) > 10 * CHI2_CRIT_0_001[7]
    t1 = [math.exp(v) for v in logits.tolist()[:4]]
    assert _chi2(counts[:4], [v / sum(t1) for v in t1]) > 10 * crit
    # reported log-probs: log softmax(logits / T) of the chosen token, before filtering
    full = torch.log_softmax(logits / temperature, -1)
    assert torch.allclose(logp, full[tokens], atol=1e-6)
