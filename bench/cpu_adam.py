"""The CPU share of Adam (megatron-core's HybridDeviceOptimizer), as megatron builds it against
Tandem's (its fp32 weights pinned: tandem/train/cpu_adam.py), one optimizer step each, alternating.

    python bench/cpu_adam.py [--layers 6] [--threads 2,12] [--repeats 3]

Parameters: `--layers` Qwen2.5-7B decoder layers (bf16 on the GPU, ~233M each; 6.5 of them are
the 20% of a 7B model that deploy/configs/one_gpu_7b.yaml puts on the CPU), all on the CPU
(offload_fraction 1), fp32 gradients as megatron's precision-aware optimizer hands them over
(`decoupled_grad`), megatron's settings: CPU and GPU AdamW fused, fp32 updates, gradient copies
and weight copies back on their own streams. Both optimizers update the same GPU parameters.
Prints, at each torch thread count, each variant's step seconds (median) and their ratio, and the
machine. Needs CUDA.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import psutil
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tandem.train.cpu_adam import pin_cpu_share  # noqa: E402

H, FFN, KV = 3584, 18944, 512  # Qwen2.5-7B
LAYER = [(H, H), (KV, H), (KV, H), (H, H), (FFN, H), (FFN, H), (H, FFN), (H,), (H,)]


def build(params: list[torch.Tensor]):
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    return HybridDeviceOptimizer(params, offload_fraction=1.0, cpu_optimizer_cls=torch.optim.AdamW,
                                 gpu_optimizer_cls=torch.optim.AdamW, param_update_in_fp32=True,
                                 overlap_cpu_optimizer_d2h_h2d=True, lr=1e-6, weight_decay=0.01,
                                 betas=(0.9, 0.999), eps=1e-8, fused=True)


def timed_step(opt) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--threads", default="2,12", help="torch thread counts, comma-separated (the actor's "
                   "default services.actor.torch_threads is 2; deploy/configs/one_gpu_7b.yaml sets 12)")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    params = [torch.nn.Parameter(torch.randn(s, device="cuda", dtype=torch.bfloat16) * 0.02)
              for _ in range(a.layers) for s in LAYER]
    for q in params:
        q.decoupled_grad = torch.randn(q.shape, device="cuda", dtype=torch.float32) * 1e-3
    numel = sum(q.numel() for q in params)
    t0 = time.perf_counter()
    variants = {"megatron": build(params)}
    built_s = time.perf_counter() - t0
    variants["pinned"] = build(params)
    rss0, t0 = psutil.Process().memory_info().rss, time.perf_counter()
    pinned_gb = pin_cpu_share(variants["pinned"]) / 1e9
    pin_s, rss_gb = time.perf_counter() - t0, (psutil.Process().memory_info().rss - rss0) / 1e9
    for opt in variants.values():  # the first step creates the Adam state
        timed_step(opt)
    print(f"machine: {torch.cuda.get_device_name()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"Python {platform.python_version()}; {numel / 1e9:.2f}B parameters on the CPU")
    print(f"build {built_s:.2f} s; pinning the fp32 copies {pin_s:.2f} s for {pinned_gb:.1f} GB "
          f"(process RSS {rss_gb:+.1f} GB: the pageable copies freed, the pinned ones allocated)")
    for threads in [int(t) for t in a.threads.split(",")]:
        torch.set_num_threads(threads)
        times = {k: [] for k in variants}
        for _ in range(a.repeats):
            for k, opt in variants.items():
                times[k].append(timed_step(opt))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{threads} threads:")
        for k, v in times.items():
            print(f"  {k:9s} step s: median {med[k]:.3f}  ({', '.join(f'{x:.3f}' for x in v)})")
        print(f"  pinned / megatron: {med['pinned'] / med['megatron']:.2f}x")


if __name__ == "__main__":
    main()
