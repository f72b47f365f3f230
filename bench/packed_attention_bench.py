"""Packed (varlen) causal attention of a training micro-batch: torch's attention kernels side by side.

    python bench/packed_attention_bench.py                      # 0.5B heads (14 / 2, d 64), 16 rows
    python bench/packed_attention_bench.py --heads 12 --kv-heads 2 --head-dim 128 --rows 16   # 1.5B

The step's trace (bench/trace_gaps.py) puts flash attention's forward at ~100 TFLOP/s on an H200 at
the e2e bench's shapes (rows of 640-770 tokens, head dim 64): far below the GEMMs. This times, on
one packed micro-batch of --rows sequences (a prompt of 128-256 tokens and --response tokens each),
forward alone and forward + backward of each aten kernel that takes cu_seqlens: flash (what
tandem/models/attention.py calls), cuDNN (keys / values as they are, and with their heads repeated
for the query heads) and memory-efficient; its TFLOP/s (causal: half the square); and its largest
difference from flash's output and gradients. Times are medians of --repeats CUDA-event timings
(token_stats_bench.timed);
the ratio column is against flash, measured in the same process.
"""
from __future__ import annotations

import argparse
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from token_stats_bench import timed  # noqa: E402


def flash(q, k, v, cu, n, scale):
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, n, n, 0.0, True, False, scale=scale)[0]


def cudnn(q, k, v, cu, n, scale):
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, n, n, True, 0.0, True, False,
                                                   scale=scale)[0]


def cudnn_repeated(q, k, v, cu, n, scale):
    rep = q.shape[1] // k.shape[1]
    return cudnn(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), cu, n, scale)


def efficient(q, k, v, cu, n, scale):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return torch.ops.aten._efficient_attention_forward(q[None], k[None], v[None], None, cu, cu, n, n, 0.0, 1,
                                                       True, scale=scale)[0][0]


KERNELS = {"flash": flash, "cudnn": cudnn, "cudnn (heads repeated)": cudnn_repeated, "efficient": efficient}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--response", type=int, default=511)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("packed_attention_bench needs a CUDA GPU")
        return
    random.seed(0)
    lengths = [random.randint(128, 256) + a.response for _ in range(a.rows)]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    n, total, d = max(lengths), sum(lengths), a.head_dim
    scale = d ** -0.5
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(total, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
               for h in (a.heads, a.kv_heads, a.kv_heads))
    grad = torch.randn(total, a.heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    flops = sum(2 * 2 * L * L / 2 * d * a.heads for L in lengths)  # QK^T and PV, causal half
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {a.rows} rows of {min(lengths)}-{n} tokens "
          f"({total} in all), heads {a.heads} / {a.kv_heads}, head dim {d}, bf16; "
          f"{flops / 1e9:.1f} GFLOP forward, x3.5 forward + backward")
    ref = None
    rows = []
    for name, fn in KERNELS.items():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        try:
            with torch.no_grad():
                fwd = timed(lambda: fn(*leaves, cu, n, scale), a.repeats)

            def both():
                out = fn(*leaves, cu, n, scale)
                out.backward(grad)
            both_ms = timed(both, a.repeats)
            for t in leaves:
                t.grad = None
            out = fn(*leaves, cu, n, scale)
            out.backward(grad)
            got = [out.detach(), *(t.grad for t in leaves)]
        except Exception as e:  # a kernel this torch / GPU does not offer for these inputs
            print(f"{name}: not available here ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
            continue
        ref = ref or (fwd, both_ms, got)
        diff = max((g.float() - r.float()).abs().max().item() for g, r in zip(got, ref[2]))
        rows.append((name, fwd, flops / fwd / 1e9, ref[0] / fwd, both_ms, 3.5 * flops / both_ms / 1e9,
                     ref[1] / both_ms, diff))
    print("| kernel | forward ms | TFLOP/s | speed-up over flash | fwd + bwd ms | TFLOP/s | speed-up over flash "
          "| max diff to flash |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.3f} | {r[2]:.0f} | {r[3]:.2f} | {r[4]:.3f} | {r[5]:.0f} | {r[6]:.2f} | {r[7]:.3g} |")


if __name__ == "__main__":
    main()
