"""A micro-batch's weight gradients of one Qwen2.5-7B decoder layer into megatron's fp32 main_grad:
autograd's bf16 GEMM then DDP's fp32 add (megatron without Apex) against the GEMM adding into
main_grad itself (tandem/models/main_grad_linear.py), alternating on the same tensors.

    python bench/wgrad_fusion.py [--tokens 2560,5120] [--repeats 20]

Per linear (attention QKV and output, MLP up+gate and down) at each token count: milliseconds of
each way, their ratio, the fused GEMM's TFLOP/s and its largest difference from the unfused result
(relative to the largest value; the fused one rounds once, in fp32). Then the layer's totals and
the machine. The difference is taken after two micro-batches added onto a random gradient. Needs CUDA.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tandem.models.main_grad_linear import weight_grad  # noqa: E402

H, FFN, KV = 3584, 18944, 512  # Qwen2.5-7B
LINEARS = {"qkv": (H + 2 * KV, H), "proj": (H, H), "fc1": (2 * FFN, H), "fc2": (H, FFN)}


def cuda_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="2560,5120", help="tokens per micro-batch, comma-separated "
                   "(deploy/configs/one_gpu_7b.yaml's budget is 2,560)")
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    torch.manual_seed(0)
    print(f"machine: {torch.cuda.get_device_name()}, torch {torch.__version__}, Python {platform.python_version()}")
    for tokens in [int(t) for t in a.tokens.split(",")]:
        total = {"unfused": 0.0, "fused": 0.0}
        for name, (out_f, in_f) in LINEARS.items():
            x = torch.randn(tokens, in_f, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(tokens, out_f, device="cuda", dtype=torch.bfloat16)
            weight = torch.nn.Parameter(torch.empty(out_f, in_f, device="cuda", dtype=torch.bfloat16))
            weight.main_grad = torch.zeros(out_f, in_f, device="cuda", dtype=torch.float32)

            def unfused():
                weight.main_grad.add_(dy.t() @ x)

            def fused():
                weight_grad(weight, dy, x)

            results, start = [], torch.randn(out_f, in_f, device="cuda") * tokens ** 0.5  # a product's scale
            for fn in (unfused, fused):  # twice onto a gradient already there: accumulation, not assignment
                weight.main_grad.copy_(start)
                fn()
                fn()
                results.append(weight.main_grad.clone())
            diff = ((results[0] - results[1]).abs().max() / results[0].abs().max()).item()
            ms = {"unfused": cuda_ms(unfused, a.repeats), "fused": cuda_ms(fused, a.repeats)}
            for k in total:
                total[k] += ms[k]
            tflops = 2 * tokens * in_f * out_f / ms["fused"] / 1e9
            print(f"{tokens} tokens, {name} [{out_f} x {in_f}]: unfused {ms['unfused']:.3f} ms, fused "
                  f"{ms['fused']:.3f} ms, fused / unfused {ms['fused'] / ms['unfused']:.2f}x, "
                  f"{tflops:.0f} TFLOP/s, max difference {diff:.1e}")
        print(f"{tokens} tokens, the layer: unfused {total['unfused']:.3f} ms, fused {total['fused']:.3f} ms, "
              f"fused / unfused {total['fused'] / total['unfused']:.2f}x")


if __name__ == "__main__":
    main()
