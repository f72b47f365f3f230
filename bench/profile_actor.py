"""Where the actor's update step spends its time: torch.profiler over bench/actor_update_mfu.py's
actor step (one GPU), top operators by self device time and by self CPU time.

    python bench/profile_actor.py [--shape 0.5b] [--steps 2] [--top 25] [--eager] [--sync-sites]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


CATEGORIES = (  # first match wins: (name, substrings of the kernel name, lower case)
    ("attention", ("flash", "fmha", "attention", "cudnn")),
    ("gemm", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("nccl", ("nccl",)),
    ("copy/cast", ("copy", "cast", "memcpy", "memset", "fill")),
    ("reduce", ("reduce", "softmax", "norm", "logsumexp")),
    ("elementwise", ("elementwise", "vectorized", "triton", "index", "gather", "scatter", "cat")),
)


def print_categories(events, steps: int) -> None:
    """Device time per step by kernel category (CUDA kernels only)."""
    totals: dict[str, float] = {}
    kernels: dict[str, list] = {}
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CUDA or getattr(e, "is_user_annotation", False):
            continue  # GPU-side user annotations (Optimizer.step#...) repeat their kernels' time
        name = e.key.lower()
        cat = next((c for c, keys in CATEGORIES if any(k in name for k in keys)), "other")
        ms = e.self_device_time_total / 1e3 / steps
        totals[cat] = totals.get(cat, 0.0) + ms
        kernels.setdefault(cat, []).append((ms, e.count // steps, e.key[:90]))
    whole = sum(totals.values())
    print(f"device time per step: {whole:.1f} ms")
    for cat, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {cat:12s} {ms:8.1f} ms  {ms / whole:6.1%}")
        for k_ms, calls, name in sorted(kernels[cat], reverse=True)[:3]:  # its biggest kernels
            print(f"      {k_ms:7.2f} ms  {calls:5d} calls  {name}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="0.5b")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--path", default="actor", choices=("actor", "plain"))
    p.add_argument("--unfused", action="store_true", help="without megatron's SwiGLU/bias-dropout-add fusions")
    p.add_argument("--eager", action="store_true", help="without torch.compile of the layers (the default compiles them)")
    p.add_argument("--sync-sites", action="store_true",
                   help="also run one step with CUDA sync debugging: each host sync prints where it came from")
    a = p.parse_args()
    import actor_update_mfu as mfu

    from tandem.models import attention, build
    from tandem.parallel.layout import ParallelConfig, init_distributed

    build.FUSE_ON_GPU = not a.unfused

    init_distributed(ParallelConfig(), 0, 1, seed=1)
    print(f"varlen attention: {'flash varlen (aten)' if attention._varlen_attn is not None else 'padded SDPA'}")
    shape, model, ddp, opt = mfu.build(a.shape, compiled=not a.eager)
    batch = mfu.actor_batch(mfu.SHAPES[a.shape]["batch"])[0]
    rows = len(batch)
    step = mfu.actor_step_fn(ddp, opt, batch, rows) if a.path == "actor" else mfu.plain_step_fn(ddp, opt, rows)

    step()
    step()
    torch.cuda.synchronize()
    if a.sync_sites:
        import warnings
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        step()
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    print_categories(events, a.steps)
    print(events.table(sort_by="self_cuda_time_total", row_limit=a.top, max_name_column_width=60))
    print(events.table(sort_by="self_cpu_time_total", row_limit=a.top, max_name_column_width=60))


if __name__ == "__main__":
    main()
