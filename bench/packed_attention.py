"""Packed causal attention for the actor's training step: forward + backward per layer call,
torch's varlen flash attention (the actor's GPU path, through its aten op) against the alternatives torch ships.

    python bench/packed_attention.py [--shapes 0.5b,1.5b] [--reps 20]

The sequences are bench/actor_update_mfu.py's actor batch (prompts 512-1024 + responses
256-1024 tokens, packed without padding: [t, heads, d] with cu_seqlens), bf16, Qwen2.5
head layouts (GQA). Backends:
  varlen      tandem.models.attention's GPU path: torch's FA2 on the ragged batch
              (aten._flash_attention_forward with cu_seqlens; GQA heads as they are)
  cudnn       aten._cudnn_attention_forward on the ragged batch (cum_seq_q/k, as torch's
              nested-tensor SDPA calls it), GQA heads as they are; autograd through
              aten._cudnn_attention_backward
  cudnn-exp   the same with the key/value heads expanded
  padded      SDPA (cuDNN backend) over the sequences right-padded to the longest, with
              the pad and unpad copies
Each is timed against `varlen` in the same run (ratio > 1: faster than varlen), and its
output and gradients are compared with varlen's.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from actor_update_mfu import actor_batch, timed  # noqa: E402  the actor bench's batch and timer

HEADS = {"0.5b": (14, 2, 64, 8), "1.5b": (12, 2, 128, 4)}  # heads, kv heads, head dim, rows


def varlen(q, k, v, cu, max_len, scale):
    from tandem.models.attention import _varlen_attn

    return _varlen_attn(q, k, v, cu, max_len, scale)


def cudnn(q, k, v, cu, max_len, scale, expand=False):
    from tandem.models.attention import _expand_heads

    if expand:
        k, v = _expand_heads(k, q.shape[1]), _expand_heads(v, q.shape[1])
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, max_len, max_len, True, 0.0, True,
                                                   False, scale=scale)[0]


def padded(q, k, v, cu, max_len, scale):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    lens = (cu[1:] - cu[:-1]).tolist()
    seq = torch.repeat_interleave(torch.arange(len(lens), device=q.device), torch.tensor(lens, device=q.device))
    pos = torch.arange(q.shape[0], device=q.device) - cu[:-1][seq]
    q, k, v = (t.new_zeros(len(lens), max_len, *t.shape[1:]).index_put((seq, pos), t).transpose(1, 2)
               for t in (q, k, v))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    return out.transpose(1, 2)[seq, pos]


BACKENDS = {"varlen": varlen, "cudnn": cudnn, "cudnn-exp": lambda *a: cudnn(*a, expand=True), "padded": padded}


def run(shape: str, reps: int) -> None:
    heads, groups, d, rows = HEADS[shape]
    lens = actor_batch(rows)[1]
    t, max_len, scale = sum(lens), max(lens), 1 / math.sqrt(d)
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for h in (heads, groups, groups))
    grad = torch.randn(t, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
    flops = sum(4 * n * n * d * heads / 2 for n in lens) * 3.5  # causal fwd (2 GEMMs) + bwd (2.5x)

    def step(fn):
        for x in (q, k, v):
            x.grad = None
        out = fn(q, k, v, cu, max_len, scale)
        out.backward(grad)
        return out

    ref = step(varlen).detach().float()
    ref_grads = [x.grad.float() for x in (q, k, v)]
    base = None
    for name, fn in BACKENDS.items():
        try:
            out = step(fn).detach().float()
            err = max([(out - ref).abs().max().item()] +
                      [(x.grad.float() - r).abs().max().item() for x, r in zip((q, k, v), ref_grads)])
            dt = timed(lambda: step(fn), reps)
        except Exception as e:  # noqa: BLE001 - a backend this torch lacks is a result too
            print(f"| {shape} | {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:150]} |", flush=True)
            continue
        base = base or dt
        print(f"| {shape} | {name} | {len(lens)} seqs, {t} tokens | {dt * 1e3:.3f} | {flops / dt / 1e12:.0f} | "
              f"{base / dt:.2f} | {err:.2e} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="0.5b,1.5b")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    print(f"- machine: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    print("\n| shape | backend | batch | fwd+bwd ms | TFLOP/s | speed vs varlen | max abs diff vs varlen |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for shape in args.shapes.split(","):
        run(shape, args.reps)


if __name__ == "__main__":
    main()
