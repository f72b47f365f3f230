"""Split-K ("flash-decoding") GQA decode attention in Triton, on the engine's KV cache.

One query token per slot. Program (slot, KV head, split) reads one contiguous chunk of
that KV head's cache ([max_len, d] rows, kv_cache.py's layout) once for all the query
heads of the group (a [16, d] query tile: tl.dot needs 16 rows, Qwen has 6-7) and keeps
an online softmax in fp32. The context is split only when (slot, KV head) programs alone
would leave multiprocessors idle (small batches, long contexts): then each split writes a
partial output and its log-sum-exp and a second kernel combines them (on an H200 at
batch 64-256 and 768 positions one split per program was fastest). Each slot attends
over positions 0..pos (pos: a device tensor), so there is no mask tensor and keys past
pos are never read, and the grid depends only on (batch, kv_len): the launch is
captured in the runner's CUDA graphs.

The step's new key and value are an input too: the program whose chunk holds pos uses
them in place of the (stale) cached row and writes them to the cache, so the decode
step has no separate KV-cache scatter. Optionally q, k and v come straight from the qkv
GEMM and the kernel adds their bias and applies RoPE (fp32, rounded to the cache dtype,
as the compiled qkv_rope does): one kernel per layer less in the step.

With `prefix` (the n samples of a prompt in their slots: prefix_groups.py) the prompt is
read once per group ("cascade" attention, as FlashInfer's and vLLM's), in the same launch as
the rest so that both run at once: programs of "split" 1 attend all n x qpg query heads of a
group to the prompt's keys in one [n x qpg, d] tile (tensor cores, one read of the prompt's K
and V, from the group's first slot), programs of split 0 each slot's own keys, positions
prompt_len..pos; the combine kernel merges the two by their log-sum-exps. With n = 8 and
prompts of ~200 tokens the prompt is ~40% of the bytes a decode step's attention reads. Used
when the context is not split otherwise (large batches, where it matters). (The prompt's part
as a kernel before the main one, its state then continued there, was no faster alone: two short
dependent launches; bench/results/generation.md.)

GPU only in production (the runner picks it on CUDA, SDPA elsewhere); with
TRITON_INTERPRET=1 it also runs on CPU tensors, which the unit tests use.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
MIN_CHUNK = 256  # keys per split at least: shorter splits cost more in the combine than they gain


@triton.jit
def _head(ptr, bias, offs_d, partner, sign, cos, sin, mask, ROPE: tl.constexpr, BIAS: tl.constexpr):
    """A head's (or a [heads, d] tile's) raw projection + bias, rotated (megatron's
    rotate_half RoPE: channel i pairs with i +- rot/2), in fp32."""
    x = tl.load(ptr + offs_d, mask=mask, other=0.0).to(tl.float32)
    if BIAS:
        x += tl.load(bias + offs_d, mask=mask, other=0.0).to(tl.float32)
    if ROPE:
        y = tl.load(ptr + partner, mask=mask, other=0.0).to(tl.float32)
        if BIAS:
            y += tl.load(bias + partner, mask=mask, other=0.0).to(tl.float32)
        x = x * cos + sign * y * sin
    return x


@triton.jit
def _split_kernel(Q, KN, VN, KC, VC, POS, PO, PL, O, QB, COS, SIN, PFX, MEM,
                  sq_b, sq_g, sq_h, skn_b, skn_g, svn_b, svn_g,
                  sc_b, sc_g, sc_n, so_b, so_g, so_h, sqb_g, scos_b, sm_s,
                  scale_log2, qpg, kv_len, chunk, rot, n, batch,
                  DIRECT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                  ROPE: tl.constexpr, BIAS: tl.constexpr, CASCADE: tl.constexpr, BLOCK_M: tl.constexpr,
                  PROMPT_SPLIT: tl.constexpr):
    """Program (slot, KV head, split). CASCADE: two "splits" in one launch, so both run at once:
    partial 1 is the prompt of the group whose first slot this is (_group_prompt; nothing for other
    slots), partial 0 the slot's own keys from its prompt length on; the combine kernel merges them.
    The prompt's programs have grid index PROMPT_SPLIT: 1 (launched after the slots') or 0."""
    b = tl.program_id(0)
    g = tl.program_id(1)
    s = tl.program_id(2)
    if CASCADE:
        if s == PROMPT_SPLIT:
            _group_prompt(Q, KC, VC, MEM, PFX, PO, PL, QB, COS, SIN, b, g, sq_b, sq_g, sq_h, sc_b, sc_g, sc_n,
                          sm_s, sqb_g, scos_b, scale_log2, qpg, n, batch, rot,
                          BLOCK_M, BLOCK_H, BLOCK_N, D, ROPE, BIAS)
        else:
            _slot_keys(Q, KN, VN, KC, VC, POS, PO, PL, O, QB, COS, SIN, PFX, b, g, 0,
                       sq_b, sq_g, sq_h, skn_b, skn_g, svn_b, svn_g, sc_b, sc_g, sc_n, so_b, so_g, so_h,
                       sqb_g, scos_b, scale_log2, qpg, kv_len, chunk, rot,
                       False, BLOCK_H, BLOCK_N, D, ROPE, BIAS, True)
    else:
        _slot_keys(Q, KN, VN, KC, VC, POS, PO, PL, O, QB, COS, SIN, PFX, b, g, s,
                   sq_b, sq_g, sq_h, skn_b, skn_g, svn_b, svn_g, sc_b, sc_g, sc_n, so_b, so_g, so_h,
                   sqb_g, scos_b, scale_log2, qpg, kv_len, chunk, rot,
                   DIRECT, BLOCK_H, BLOCK_N, D, ROPE, BIAS, False)


@triton.jit
def _slot_keys(Q, KN, VN, KC, VC, POS, PO, PL, O, QB, COS, SIN, PFX, b, g, s,
               sq_b, sq_g, sq_h, skn_b, skn_g, svn_b, svn_g, sc_b, sc_g, sc_n, so_b, so_g, so_h,
               sqb_g, scos_b, scale_log2, qpg, kv_len, chunk, rot,
               DIRECT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
               ROPE: tl.constexpr, BIAS: tl.constexpr, CASCADE: tl.constexpr):
    """Slot b's query heads of KV head g over its keys [s * chunk, (s + 1) * chunk) up to pos (CASCADE:
    from its prompt length on), writing the step's new key and value at pos."""
    pos = tl.load(POS + b).to(tl.int32)
    start = s * chunk
    end = tl.minimum(tl.minimum(start + chunk, pos + 1), kv_len)  # keys [start, end)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, D)
    rows = offs_h < qpg
    # with ROPE, Q / KN / VN are the qkv GEMM's raw output: bias (QB: [G, qpg + 2, d]) and
    # RoPE (COS / SIN: [b, rot] rows at each slot's position) are applied here
    half = rot // 2
    partner = tl.where(offs_d < half, offs_d + half, tl.where(offs_d < rot, offs_d - half, offs_d))
    sign = tl.where(offs_d < half, -1.0, 1.0)
    cos = tl.load(COS + b * scos_b + offs_d, mask=offs_d < rot, other=1.0).to(tl.float32)
    sin = tl.load(SIN + b * scos_b + offs_d, mask=offs_d < rot, other=0.0).to(tl.float32)
    qb = QB + g * sqb_g
    q = _head(Q + b * sq_b + g * sq_g + offs_h[:, None] * sq_h, qb + offs_h[:, None] * D, offs_d[None, :],
              partner[None, :], sign[None, :], cos[None, :], sin[None, :], rows[:, None], ROPE, BIAS)
    q = q.to(Q.dtype.element_ty)
    kn = _head(KN + b * skn_b + g * skn_g, qb + qpg * D, offs_d, partner, sign, cos, sin, offs_d < D,
               ROPE, BIAS).to(KC.dtype.element_ty)
    vn = _head(VN + b * svn_b + g * svn_g, qb + (qpg + 1) * D, offs_d, offs_d, sign, cos, sin, offs_d < D,
               False, BIAS).to(VC.dtype.element_ty)
    slot = b.to(tl.int64) * sc_b + g * sc_g  # int64: a large cache passes 2**31 elements
    kc = KC + slot
    vc = VC + slot
    if (pos >= start) & (pos < start + chunk) & (pos < kv_len):  # this program owns the new row
        tl.store(kc + pos * sc_n + offs_d, kn)
        tl.store(vc + pos * sc_n + offs_d, vn)

    first_key = start
    if CASCADE:
        lo = tl.load(PFX + b)  # the slot's shared prompt length (its group's program reads it), 0: none
        first_key = lo
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    for n0 in range(first_key, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        keep = offs_n < end
        new = (offs_n == pos)[:, None]
        k = tl.load(kc + offs_n[:, None] * sc_n + offs_d[None, :], mask=keep[:, None], other=0.0)
        k = tl.where(new, kn[None, :], k)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2  # [H, N], log2 units
        qk = tl.where(keep[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))  # finite: every block has a kept key
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vc + offs_n[:, None] * sc_n + offs_d[None, :], mask=keep[:, None], other=0.0)
        v = tl.where(new, vn[None, :], v)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new

    empty = l_i == 0.0  # a split wholly past pos
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    if DIRECT:  # one split: the final output
        tl.store(O + b * so_b + g * so_g + offs_h[:, None] * so_h + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=rows[:, None])
    else:
        part = (b * tl.num_programs(1) + g) * tl.num_programs(2) + s
        tl.store(PO + (part * BLOCK_H + offs_h[:, None]) * D + offs_d[None, :], out, mask=rows[:, None])
        tl.store(PL + part * BLOCK_H + offs_h, tl.where(empty, float("-inf"), m_i + tl.log2(l_i)), mask=rows)
        if CASCADE:
            if lo == 0:  # in no group: an empty prompt part (weight 0 in the combine)
                tl.store(PO + ((part + 1) * BLOCK_H + offs_h[:, None]) * D + offs_d[None, :], acc * 0.0,
                         mask=rows[:, None])
                tl.store(PL + (part + 1) * BLOCK_H + offs_h, tl.full([BLOCK_H], float("-inf"), tl.float32),
                         mask=rows)


@triton.jit
def _group_prompt(Q, KC, VC, MEM, PFX, PO, PL, QB, COS, SIN, s, g, sq_b, sq_g, sq_h, sc_b, sc_g, sc_n,
                  sm_s, sqb_g, scos_b, scale_log2, qpg, n, batch, rot,
                  BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                  ROPE: tl.constexpr, BIAS: tl.constexpr):
    """When slot s is the first slot of a prompt group (MEM[s, 0] == s): the group's n x qpg query
    heads of KV head g over the prompt's keys 0..PFX[s]-1, read once from slot s's cache -> each
    member slot's partial output and log2-sum-exp at split 1 of PO / PL ([b, G, 2, BLOCK_H, ...])."""
    if tl.load(MEM + s * sm_s) == s:
        plen = tl.load(PFX + s)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        j = offs_m // qpg  # row: sample j's query head h
        h = offs_m % qpg
        slot = tl.load(MEM + s * sm_s + j, mask=j < n, other=-1)
        rows = (j < n) & (slot >= 0) & (slot < batch)  # slots past the batch are dead: no query
        slot = tl.where(rows, slot, 0)
        half = rot // 2
        partner = tl.where(offs_d < half, offs_d + half, tl.where(offs_d < rot, offs_d - half, offs_d))
        sign = tl.where(offs_d < half, -1.0, 1.0)
        rope = rows[:, None] & (offs_d < rot)[None, :]
        cos = tl.load(COS + slot[:, None] * scos_b + offs_d[None, :], mask=rope, other=1.0).to(tl.float32)
        sin = tl.load(SIN + slot[:, None] * scos_b + offs_d[None, :], mask=rope, other=0.0).to(tl.float32)
        q = _head(Q + slot[:, None] * sq_b + g * sq_g + h[:, None] * sq_h, QB + g * sqb_g + h[:, None] * D,
                  offs_d[None, :], partner[None, :], sign[None, :], cos, sin, rows[:, None], ROPE, BIAS)
        q = q.to(Q.dtype.element_ty)  # rounded as _slot_keys rounds it
        cache = s.to(tl.int64) * sc_b + g * sc_g
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for n0 in range(0, plen, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            keep = offs_n < plen
            k = tl.load(KC + cache + offs_n[:, None] * sc_n + offs_d[None, :], mask=keep[:, None], other=0.0)
            qk = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2
            qk = tl.where(keep[None, :], qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(VC + cache + offs_n[:, None] * sc_n + offs_d[None, :], mask=keep[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            m_i = m_new
        part = (slot * tl.num_programs(1) + g) * 2 + 1
        tl.store(PO + (part[:, None] * BLOCK_H + h[:, None]) * D + offs_d[None, :], acc / l_i[:, None],
                 mask=rows[:, None])
        tl.store(PL + part * BLOCK_H + h, m_i + tl.log2(l_i), mask=rows)


@triton.jit
def _combine_kernel(PO, PL, O, so_b, so_g, so_h, qpg, splits,
                    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr):
    b = tl.program_id(0)
    g = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, D)
    part = (b * tl.num_programs(1) + g) * splits + offs_s  # [S]
    real = offs_s < splits
    used = real[:, None] & (offs_h < qpg)[None, :]  # [S, H]: the splits' rows of real query heads
    lse = tl.load(PL + part[:, None] * BLOCK_H + offs_h[None, :], mask=used, other=float("-inf"))
    top = tl.max(lse, 0)  # real heads: finite, split 0 always has key 0 (CASCADE: pos)
    w = tl.exp2(lse - tl.where(top == float("-inf"), 0.0, top)[None, :])  # [S, H]; padding rows: 0
    po = tl.load(PO + (part[:, None, None] * BLOCK_H + offs_h[None, :, None]) * D + offs_d[None, None, :],
                 mask=used[:, :, None], other=0.0)
    total = tl.sum(w, 0)  # >= 1 for a real head (its largest split weighs 1), 0 for padding
    out = tl.sum(w[:, :, None] * po, 0) / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(O + b * so_b + g * so_g + offs_h[:, None] * so_h + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=(offs_h < qpg)[:, None])


def supported(head_dim: int) -> bool:
    """Whether the kernel handles this head size (a power of two, 16..256)."""
    return 16 <= head_dim <= 256 and head_dim & (head_dim - 1) == 0


MAX_GROUP_ROWS = 128  # n x query heads per KV head in one prefix tile (its fp32 accumulator in registers)


def cascade_fits(n: int, qpg: int) -> bool:
    """Whether groups of n samples share their prompt through the prefix kernel."""
    return 1 < n and n * qpg <= MAX_GROUP_ROWS


def tile_keys(few: bool, head_dim: int, element_size: int) -> int:
    """Keys per tile: 128 when about one program runs per multiprocessor (more bytes in flight),
    else 64; halved while a tile holds more bytes than bf16's 128 x 128, the largest measured to
    fit shared memory at 3 stages (an fp32 cache at head dim 128 asked an H200 for 344 KB of its 227)."""
    keys = 128 if few else 64
    while keys > 16 and keys * head_dim * element_size > 128 * 128 * 2:
        keys //= 2
    return keys


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def num_splits(batch: int, groups: int, kv_len: int, sms: int) -> int:
    """Splits per (slot, KV head): up to one program per multiprocessor, none shorter
    than MIN_CHUNK keys; 1 once batch x KV heads fill the GPU."""
    return max(1, min(kv_len // MIN_CHUNK, sms // (batch * groups)))


_SMS: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    if device.index not in _SMS:
        _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device.index]


def decode_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, pos: torch.Tensor, kv_len: int, scale: float, *,
                     bias: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                     sin: torch.Tensor | None = None, prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
                     splits: int | None = None, block_n: int | None = None,
                     num_warps: int | None = None, num_stages: int | None = None,
                     prompt_first: bool = False) -> torch.Tensor:
    """q [b, G, qpg, d], k_new and v_new [b, G, d]: the step's query, key and value of
    slots 0..b-1; k_cache, v_cache [slots, G, max_len, d] (one layer, same strides); pos [b]
    (int): each slot's new cache position. Writes k_new / v_new at pos (when pos < kv_len)
    and attends each slot over positions 0..min(pos, kv_len - 1) -> [b, G, qpg, d] in q's
    dtype.

    With cos and sin ([b, rot] at each slot's RoPE position, rot <= d, megatron's
    non-interleaved layout) q / k_new / v_new are the qkv GEMM's raw output: the kernel adds
    `bias` ([G, qpg + 2, d]: per group its query heads, key, value; optional) and rotates q
    and k itself, so the decode step needs no separate bias + RoPE kernel per layer.
    prefix: (prompt lengths [slots] int32, members [slots, n] int32) of prefix_groups.PrefixGroups:
    each group's prompt is attended once (the module docstring); ignored when the context is split.
    splits, block_n, num_warps, num_stages, prompt_first (the prompt's programs first in the grid):
    tuning overrides (benchmarks)."""
    b, groups, qpg, d = q.shape
    q, k_new, v_new = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_new, v_new))
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and supported(d)
    rope = cos is not None
    if rope:
        assert sin is not None and cos.shape == sin.shape and cos.shape[0] >= b and cos.shape[-1] <= d
        assert cos.stride() == sin.stride() and cos.stride(-1) == 1
    if bias is not None:
        assert rope and bias.shape == (groups, qpg + 2, d) and bias.is_contiguous()
    block_h = max(16, triton.next_power_of_2(qpg))
    sms = _sm_count(q.device)
    splits = splits or num_splits(b, groups, kv_len, sms)
    # tuned on an H200 (bench/decode_attention_bench.py --sweep): with about one program per
    # multiprocessor each needs more bytes in flight (longer tiles, more warps for d = 128)
    few = b * groups * splits <= sms
    block_n = block_n or tile_keys(few, d, k_cache.element_size())
    num_warps = num_warps or (8 if block_n * d >= 128 * 128 else 4)
    num_stages = num_stages or 3
    chunk = triton.cdiv(triton.cdiv(kv_len, splits), block_n) * block_n
    splits = triton.cdiv(kv_len, chunk)
    cascade = prefix is not None and splits == 1
    if cascade:  # split 1: the prompt of each group, once; split 0: each slot's own keys
        plen, members = prefix
        assert plen.dtype == members.dtype == torch.int32 and members.is_contiguous() and len(plen) >= b
        splits, n = 2, members.shape[1]
    else:
        plen = members = q  # unread
        n = 1
    out = torch.empty((b, groups, qpg, d), dtype=q.dtype, device=q.device)
    if splits > 1:
        po = torch.empty((b, groups, splits, block_h, d), dtype=torch.float32, device=q.device)
        pl = torch.empty((b, groups, splits, block_h), dtype=torch.float32, device=q.device)
    else:
        po = pl = out  # unused
    _split_kernel[(b, groups, splits)](
        q, k_new, v_new, k_cache, v_cache, pos, po, pl, out,
        q if bias is None else bias, q if cos is None else cos, q if sin is None else sin,  # unread when absent
        plen, members,
        q.stride(0), q.stride(1), q.stride(2), k_new.stride(0), k_new.stride(1), v_new.stride(0),
        v_new.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), out.stride(2), (qpg + 2) * d, cos.stride(0) if rope else 0,
        members.stride(0), scale * LOG2E, qpg, kv_len, chunk, cos.shape[-1] if rope else 0, n, b,
        DIRECT=splits == 1, BLOCK_H=block_h, BLOCK_N=block_n, D=d, ROPE=rope, BIAS=bias is not None,
        CASCADE=cascade, BLOCK_M=max(16, triton.next_power_of_2(n * qpg)), PROMPT_SPLIT=0 if prompt_first else 1,
        num_warps=num_warps, num_stages=num_stages)
    if splits > 1:
        _combine_kernel[(b, groups)](po, pl, out, out.stride(0), out.stride(1), out.stride(2), qpg, splits,
                                     BLOCK_S=triton.next_power_of_2(splits),
                                     BLOCK_H=block_h, D=d)
    return out
