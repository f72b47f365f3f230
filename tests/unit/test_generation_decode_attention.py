"""decode_attention.py's Triton kernel against SDPA under a length mask, and the engine
with it. On CUDA when present; on CPU through Triton's interpreter, in a subprocess
started with TRITON_INTERPRET=1 (triton reads it when it is first imported, so it cannot
be switched on in this process). fp32 only there: the interpreter's bf16 tl.dot is wrong
(triton 3.9). The kernel tests skip without triton; the fallback tests run everywhere."""

import pytest
import torch
import torch.nn.functional as F
from triton_kernels import ONLY_WHERE_KERNEL_TESTS_SKIP, kernel_device, run_in_interpreter

from tandem.generation.engine import GenerationEngine
from tandem.generation.sampling import SamplingParams

VOCAB, PAD, EOS = 32, 0, 1
PROMPTS = [[5, 9, 3, 17, 22, 8, 4], [7, 2], [30, 12, 6, 6], [3], [11, 25, 19, 2, 14, 27], [4, 4, 9]]


@pytest.fixture
def kernel():
    """(the decode_attention module, device)."""
    dev = kernel_device()
    from tandem.generation import decode_attention

    return decode_attention, dev


@ONLY_WHERE_KERNEL_TESTS_SKIP
def test_kernel_tests_in_the_interpreter():
    """This file's kernel tests on CPU, in a process started with TRITON_INTERPRET=1."""
    run_in_interpreter(__file__, "not in_the_interpreter")


def reference(q, k_new, v_new, k_cache, v_cache, pos, kv_len, scale):
    """The runner's SDPA path: scatter the new rows (pos < kv_len), attend under the mask."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    for i, p in enumerate(pos.tolist()):
        if p < kv_len:
            k_cache[i, :, p], v_cache[i, :, p] = k_new[i], v_new[i]
    b = q.shape[0]
    allowed = (torch.arange(kv_len, device=q.device)[None] <= pos[:, None])[:, None, None]
    out = F.scaled_dot_product_attention(q.float(), k_cache[:b, :, :kv_len].float(),
                                         v_cache[:b, :, :kv_len].float(), attn_mask=allowed, scale=scale)
    return out, k_cache, v_cache


# (kv heads, query heads per kv head, head dim): Qwen2.5-0.5B, Qwen2.5-1.5B, plain MHA
@pytest.mark.parametrize("groups,qpg,d", [(2, 7, 64), (2, 6, 128), (3, 1, 16)])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_kernel_matches_sdpa_and_writes_the_cache(kernel, groups, qpg, d, splits):
    mod, dev = kernel
    dtypes = [torch.float32] + ([torch.bfloat16] if dev == "cuda" else [])
    g = torch.Generator().manual_seed(d + qpg)
    slots, max_len, kv_len = 6, 112, 100
    b = slots - 1  # the last slot is outside the batch: untouched
    pos = torch.randint(0, kv_len, (b,), generator=g)
    pos[0], pos[1], pos[2] = 0, kv_len - 1, kv_len + 5  # first key, last key, a dead slot past kv_len
    for dtype in dtypes:
        def rand(*shape):
            return torch.randn(*shape, generator=g).to(dev, dtype)
        q, kv = rand(b, groups, qpg, d), rand(b, groups, 2, d)
        k_new, v_new = kv[:, :, 0], kv[:, :, 1]  # strided views, like the qkv split's
        k_cache, v_cache = rand(slots, groups, max_len, d), rand(slots, groups, max_len, d)
        want, k_want, v_want = reference(q, k_new, v_new, k_cache, v_cache, pos.to(dev), kv_len, d ** -0.5)
        out = mod.decode_attention(q, k_new, v_new, k_cache, v_cache, pos.to(dev), kv_len, d ** -0.5,
                                   splits=splits, block_n=16 if dev == "cpu" else None)
        assert out.shape == q.shape and out.dtype == dtype
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(out.float(), want, atol=tol, rtol=0)
        assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)


@pytest.mark.parametrize("groups,qpg,d,rot,bias", [(2, 7, 64, 64, True), (2, 6, 128, 128, False),
                                                  (3, 1, 16, 8, True)])  # the last: partial rotary
@pytest.mark.parametrize("splits", [1, 3])
def test_kernel_adds_the_bias_and_applies_rope_to_the_raw_qkv(kernel, groups, qpg, d, rot, bias, splits):
    """q, k, v straight from the qkv GEMM: the kernel's bias + RoPE equal fused_step.rope_heads
    (the compiled qkv_rope's math) followed by the plain kernel, cache writes included."""
    from tandem.generation.fused_step import rope_heads

    mod, dev = kernel
    g = torch.Generator().manual_seed(d + rot)
    slots, max_len, kv_len, b = 5, 96, 90, 4
    pos = torch.tensor([0, 89, 37, 95]).to(dev)  # first key, last key, middle, dead slot past kv_len
    raw = torch.randn(b, groups * (qpg + 2) * d, generator=g).to(dev)
    b_qkv = torch.randn(groups * (qpg + 2) * d, generator=g).to(dev) if bias else None
    angles = torch.rand(b, rot // 2, generator=g).to(dev) * 6.0
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    k_cache, v_cache = (torch.randn(slots, groups, max_len, d, generator=g).to(dev) for _ in range(2))
    q, k, v = rope_heads(raw if b_qkv is None else raw + b_qkv, None, None, cos, sin, None, groups, qpg, d)
    want, k_want, v_want = reference(q, k, v, k_cache, v_cache, pos, kv_len, d ** -0.5)
    heads = raw.view(b, groups, qpg + 2, d)
    out = mod.decode_attention(heads[:, :, :qpg], heads[:, :, qpg], heads[:, :, qpg + 1], k_cache, v_cache, pos,
                               kv_len, d ** -0.5, bias=None if b_qkv is None else b_qkv.view(groups, qpg + 2, d),
                               cos=cos, sin=sin, splits=splits, block_n=16 if dev == "cpu" else None)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(k_cache, k_want, atol=1e-6, rtol=0)
    torch.testing.assert_close(v_cache, v_want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("groups,qpg,d", [(2, 7, 64), (2, 6, 128), (3, 1, 16)])
@pytest.mark.parametrize("raw,prompt_first", [(False, False), (True, False), (True, True)])
def test_the_prefix_kernel_equals_each_slot_reading_its_own_copy(kernel, groups, qpg, d, raw, prompt_first):
    """Prompt groups read their prompt once (decode_attention's prefix kernel): the same outputs and
    cache writes as every slot attending over its own copy. Slots: a group (0, 1, 2) at 5 positions,
    a group (3, 6, 7) whose slot 7 lies past the batch (dead), a group at 9 positions that was broken
    (one of its slots refilled: its others read their own copies), and slot 8 in no group."""
    from tandem.generation.prefix_groups import PrefixGroups

    mod, dev = kernel
    g = torch.Generator().manual_seed(d + qpg + raw)
    slots, max_len, kv_len, b = 12, 48, 40, 9

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dev)

    k_cache, v_cache = rand(slots, groups, max_len, d), rand(slots, groups, max_len, d)
    pg = PrefixGroups(slots, 3, torch.device(dev))
    pg.admit([((0, 1, 2), 5), ((3, 6, 7), 12), ((4, 5, 10), 9)])
    pg.admit([((11, 10, 9), 2)])  # slot 10 refilled: (4, 5, 10) stops sharing, slot 9 lies past the batch
    for group, length in (((0, 1, 2), 5), ((3, 6, 7), 12), ((4, 5, 10), 9), ((9, 10, 11), 2)):
        for c in group[1:]:  # the prefill's copies
            k_cache[c, :, :length] = k_cache[group[0], :, :length]
            v_cache[c, :, :length] = v_cache[group[0], :, :length]
    pos = torch.tensor([5, 5, 9, 30, 15, 20, 33, 12, 7], device=dev)
    kw = {}
    if raw:  # the qkv GEMM's output: bias and RoPE applied by both kernels
        heads = rand(b, groups, qpg + 2, d)
        q, k_new, v_new = heads[:, :, :qpg], heads[:, :, qpg], heads[:, :, qpg + 1]
        kw = dict(bias=rand(groups, qpg + 2, d), cos=rand(b, d), sin=rand(b, d))
    else:
        q, kv = rand(b, groups, qpg, d), rand(b, groups, 2, d)
        k_new, v_new = kv[:, :, 0], kv[:, :, 1]
    k_own, v_own = k_cache.clone(), v_cache.clone()
    want = mod.decode_attention(q, k_new, v_new, k_own, v_own, pos, kv_len, d ** -0.5, splits=1, block_n=16, **kw)
    out = mod.decode_attention(q, k_new, v_new, k_cache, v_cache, pos, kv_len, d ** -0.5, splits=1, block_n=16,
                               prefix=pg.tensors(), prompt_first=prompt_first, **kw)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
    assert torch.equal(k_cache, k_own) and torch.equal(v_cache, v_own)
    assert pg.plen.tolist() == [5, 5, 5, 12, 0, 0, 12, 12, 0, 2, 2, 2]


def test_tiles_of_a_4_byte_cache_hold_no_more_bytes_than_bf16_s():
    """An fp32 cache at head dim 128 with the few-programs tile (128 keys) asked an H200 for 344 KB of
    shared memory (227 KB there): such tiles are halved; bf16's tuned sizes are kept."""
    pytest.importorskip("triton")
    from tandem.generation.decode_attention import tile_keys

    assert tile_keys(True, 128, 2) == 128 and tile_keys(False, 128, 2) == 64  # bf16 as tuned
    assert tile_keys(True, 64, 2) == 128 and tile_keys(True, 64, 4) == 128
    assert tile_keys(True, 128, 4) == 64 and tile_keys(False, 128, 4) == 64
    assert tile_keys(True, 256, 4) == 32


def test_the_context_is_split_only_when_the_grid_is_small():
    pytest.importorskip("triton")
    from tandem.generation.decode_attention import MIN_CHUNK, num_splits

    assert num_splits(256, 2, 768, 132) == 1  # 512 programs fill an H200
    assert num_splits(64, 2, 768, 132) == 1
    assert num_splits(8, 2, 4096, 132) == 8  # 16 programs: split, up to one program per SM
    assert num_splits(8, 2, 128, 132) == 1  # no split shorter than MIN_CHUNK
    assert num_splits(1, 1, 100 * MIN_CHUNK, 132) == 100


@pytest.fixture(scope="module")
def model(megatron_dist):
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape

    torch.manual_seed(0)
    shape = ModelShape(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                       init_std=0.3, attention_bias=True, tie_word_embeddings=True)
    return build_gpt_model(shape).eval()


def generate(model, attention, fused, **kw):
    e = GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, max_batch_size=5, sync_every=3,
                         decode_attention=attention, fused_decode=fused, compile_decode=False, **kw)
    params = SamplingParams(max_new_tokens=7, temperature=0.8, top_k=8, n=2, seed=11)
    return e, e.generate(PROMPTS, params)


def same(a, b):
    assert torch.equal(a.responses, b.responses) and torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(a.rollout_log_probs, b.rollout_log_probs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fused", [True])  # unfused: the kernel tests above (q, k, v given) and the test below
def test_engine_with_the_kernel_equals_sdpa(kernel, model, fused):
    """5 slots for 12 rows (refill), windows of 3 steps, sampling: the kernel's own cache
    writes and per-slot lengths give SDPA's rows."""
    e, res = generate(model, "triton", fused)
    assert e.runner.kernel is not None
    same(res, generate(model, "sdpa", fused)[1])


@pytest.mark.parametrize("fused", [False])  # fused: the test below
def test_engine_reading_each_prompt_once_equals_its_own_copies(kernel, model, fused):
    """n = 3 samples, 5 slots for 18 rows: groups are refilled into freed slots (broken groups
    read their own copies); the prefix kernel gives the rows of each slot reading its own cache
    (SDPA's rows, which equal the plain kernel's: the test above; SDPA keeps the interpreter's time down)."""
    params = SamplingParams(max_new_tokens=7, temperature=0.8, top_k=8, n=3, seed=5)
    runs = {}
    for attention, shared in (("triton", True), ("sdpa", False)):
        e = GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, max_batch_size=5, sync_every=3,
                             decode_attention=attention, fused_decode=fused, compile_decode=False,
                             shared_prefix=shared)
        runs[shared] = e.generate(PROMPTS, params)
        assert (e.runner.prefix is not None) == shared
    same(runs[True], runs[False])
    assert runs[True].response_mask.sum() > len(PROMPTS) * 3  # decoded past the prefill's token


def test_one_engine_keeps_prompt_groups_per_n(kernel, model):
    """Requests with n = 3, 2, 1, 3 on one engine: each n has its own groups (captured graphs keep
    pointing at them), n = 1 shares nothing, and every request equals an SDPA engine without sharing."""
    engines = {shared: GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, max_batch_size=6,
                                        sync_every=2, decode_attention="triton" if shared else "sdpa",
                                        fused_decode=True, compile_decode=False, shared_prefix=shared)
               for shared in (True, False)}
    for n in (3, 2, 1, 3):
        params = SamplingParams(max_new_tokens=5, temperature=0.9, n=n, seed=n)
        res = {shared: e.generate(PROMPTS[:4], params) for shared, e in engines.items()}
        same(res[True], res[False])
        assert (engines[True].runner.prefix is None) == (n == 1)
    assert sorted(engines[True].runner._prefix_by_n) == [2, 3]


def test_without_the_kernel_the_runner_uses_sdpa(model, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("the kernel runs here")
    e, res = generate(model, "triton", True)  # CPU without the interpreter: no kernel
    assert e.runner.kernel is None and e.runner.decode_attention == "sdpa"
    same(res, generate(model, "sdpa", True)[1])


def test_a_failing_kernel_falls_back_to_sdpa(model):
    def broken(*args):
        raise RuntimeError("no kernel image for this device")

    e = GenerationEngine(model, pad_id=PAD, eos_id=EOS, vocab_size=VOCAB, max_batch_size=5, sync_every=3,
                         decode_attention="sdpa", fused_decode=True)
    params = SamplingParams(max_new_tokens=7, temperature=0.8, top_k=8, n=2, seed=11)
    e.generate(PROMPTS[:1], params)  # builds the runner
    e.runner.kernel = broken
    res = e.generate(PROMPTS, params)
    assert e.runner.kernel is None and e.runner.decode_attention == "sdpa"
    same(res, generate(model, "sdpa", True)[1])
