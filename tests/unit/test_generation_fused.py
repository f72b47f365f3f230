"""The fused decode step (fused_step.py, the GPU default) against the module path: same
tokens and log-probs on CPU, uncompiled and compiled, with refill and sampling."""

import pytest
import torch
import torch.nn.functional as F

from tandem.generation.engine import GenerationEngine
from tandem.generation.fused_step import DecodeFns, DecodeWeights, _Guarded
from tandem.generation.sampling import SamplingParams
from tandem.models.forward import forward_logits

VOCAB, PAD, EOS = 32, 0, 1
PROMPTS = [[5, 9, 3, 17, 22, 8, 4], [7, 2], [30, 12, 6, 6], [3], [11, 25, 19, 2, 14, 27], [4, 4, 9]]
PARAMS = [SamplingParams(max_new_tokens=9, greedy=True),
          SamplingParams(max_new_tokens=9, temperature=0.8, top_k=8, top_p=0.95, n=2, seed=11)]


def _build(**kw):
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape

    torch.manual_seed(0)
    # qkv bias and tied embeddings: the Qwen2 layout the bench and real checkpoints use
    shape = ModelShape(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                       init_std=0.3, attention_bias=True, tie_word_embeddings=True, **kw)
    return build_gpt_model(shape).eval()


@pytest.fixture(scope="module")
def model(megatron_dist):
    return _build()


def generate(model, fused, compile=False, **kw):
    e = GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, max_batch_size=5,
                         fused_decode=fused, compile_decode=compile, **kw)
    out = [e.generate(PROMPTS, p) for p in PARAMS]
    assert (e.runner.weights is not None) == fused
    return out


def same(a, b, atol):
    assert torch.equal(a.responses, b.responses)
    assert torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(a.rollout_log_probs, b.rollout_log_probs, atol=atol, rtol=0)


@pytest.mark.parametrize("attention", ["sdpa", "matmul"])
def test_fused_step_equals_module_step(model, attention):
    """5 slots for 6-12 rows (refill), windows of 3 steps, greedy and top-k/top-p sampling."""
    for a, b in zip(generate(model, False, sync_every=3, decode_attention=attention),
                    generate(model, True, sync_every=3, decode_attention=attention)):
        same(a, b, atol=1e-6)


@torch.no_grad()
def test_fused_greedy_equals_full_recompute(model):
    res = generate(model, True)[0]
    for i, p in enumerate(PROMPTS):
        seq = list(p)
        for t in range(int(res.response_mask[i].sum())):
            ids = torch.tensor([seq])
            logits = forward_logits(model, ids, torch.ones_like(ids))[0, -1].float()
            assert res.responses[i, t].item() == int(logits.argmax()), f"row {i} token {t}"
            assert abs(res.rollout_log_probs[i, t].item() - float(torch.log_softmax(logits, -1).max())) < 1e-5
            seq.append(int(logits.argmax()))


def test_compiled_fused_step_equals_module_step(model):
    """torch.compile (inductor, CPU here) of the step's functions, the in-place window
    bookkeeping (`advance`) too, over windows of 3 steps: same tokens."""
    pytest.importorskip("torch._inductor")
    for a, b in zip(generate(model, False, sync_every=3), generate(model, True, compile=True, sync_every=3)):
        same(a, b, atol=1e-4)


def test_unknown_compile_mode_is_rejected():
    with pytest.raises(ValueError, match="compile must be"):
        DecodeFns("fast")


def test_qk_layernorm_models_use_the_fused_step(megatron_dist):
    from tandem.models.spec import ModelShape

    if "qk_layernorm" not in ModelShape.__dataclass_fields__:
        pytest.skip("this ModelShape has no qk_layernorm")
    m = _build(qk_layernorm=True)
    for a, b in zip(generate(m, False), generate(m, True)):
        same(a, b, atol=1e-6)


def test_models_it_does_not_cover_keep_the_module_path(model):
    assert DecodeWeights.from_model(model) is not None
    model.config.activation_func = F.gelu
    try:
        assert DecodeWeights.from_model(model) is None
        e = GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, fused_decode=True)
        e.generate(PROMPTS[:2], SamplingParams(max_new_tokens=2, greedy=True))
        assert e.runner.weights is None
    finally:
        model.config.activation_func = F.silu


def test_a_failing_compile_falls_back_to_eager():
    def broken(x):
        raise RuntimeError("inductor bug")

    fn = _Guarded(lambda x: x + 1, broken)
    assert fn(1) == 2 and fn.compiled is None and fn(2) == 3
