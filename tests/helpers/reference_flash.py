"""Varlen flash attention's two aten calls written out in dense torch arithmetic, per sequence: the
forward returns (out, log-sum-exp [heads, t], rng, unused) and the backward takes the output and
log-sum-exp its probabilities are taken against, as flash's do. For CPU tests of code that calls
them (tandem/models/shared_prompt_attention.py), in float64; flash's own kernels are tested on
GPUs against SDPA."""
import torch


def _sequences(cu_q, cu_k):
    for i in range(len(cu_q) - 1):
        yield slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))


def _expand(t, heads):  # [m, groups, d] -> [m, heads, d]: head h reads group h // (heads / groups)
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _probs(q, k, lse, causal, scale):
    s = torch.einsum("nhd,mhd->hnm", q, _expand(k, q.shape[1])) * scale
    n, m = q.shape[0], k.shape[0]
    if causal:  # flash aligns the causal mask bottom-right
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(m - n + 1), float("-inf"))
    if lse is None:
        lse = torch.logsumexp(s, -1)
    return (s - lse[..., None]).exp(), lse


def forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
    out, lse = torch.zeros_like(q), q.new_zeros(q.shape[1], q.shape[0], dtype=torch.float64)
    for sq, sk in _sequences(cu_q, cu_k):
        p, lse[:, sq] = _probs(q[sq], k[sk], None, causal, scale)
        out[sq] = torch.einsum("hnm,mhd->nhd", p, _expand(v[sk], q.shape[1]))
    return out, lse, torch.empty(0), torch.empty(0)


def backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, rng, unused):
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    heads, groups = q.shape[1], k.shape[1]
    for sq, sk in _sequences(cu_q, cu_k):
        p, _ = _probs(q[sq], k[sk], lse[:, sq], causal, scale)
        do = dout[sq]
        dp = torch.einsum("nhd,mhd->hnm", do, _expand(v[sk], heads))
        ds = p * (dp - (do * out[sq]).sum(-1).t()[..., None])
        dq[sq] = torch.einsum("hnm,mhd->nhd", ds, _expand(k[sk], heads)) * scale
        m = k[sk].shape[0]
        dk[sk] = (torch.einsum("hnm,nhd->mhd", ds, q[sq]) * scale).view(m, groups, -1, q.shape[2]).sum(2)
        dv[sk] = torch.einsum("hnm,nhd->mhd", p, do).view(m, groups, -1, q.shape[2]).sum(2)
    return dq, dk, dv
