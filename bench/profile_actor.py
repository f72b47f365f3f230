"""Where the actor's update step spends its time: torch.profiler over bench/actor_update_mfu.py's
actor step (one GPU), top operators by self device time and by self CPU time.

    python bench/profile_actor.py [--shape 0.5b] [--steps 2] [--top 25]
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="0.5b")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    import actor_update_mfu as mfu

    from tandem.config import ActorConfig
    from tandem.dist.parallel import ParallelConfig, init_distributed
    from tandem.models import attention
    from tandem.train import losses
    from tandem.train.step import train_steps

    init_distributed(ParallelConfig(), 0, 1, f"file://{os.path.join(tempfile.mkdtemp(), 'rdzv')}", seed=1)
    print(f"varlen attention: {'torch varlen_attn' if attention._varlen_attn is not None else 'per-sequence SDPA'}")
    shape, model, ddp, opt = mfu.build(a.shape)
    batch, _ = mfu.actor_batch(mfu.SHAPES[a.shape]["batch"])
    loss_fn = functools.partial(losses.ppo_actor_loss, cfg=ActorConfig(entropy_coeff=0.0), temperature=1.0)

    def step():
        train_steps(ddp, opt, [batch], len(batch), loss_fn, "grad_norm", "lr")

    step()
    step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    print(events.table(sort_by="self_cuda_time_total", row_limit=a.top, max_name_column_width=60))
    print(events.table(sort_by="self_cpu_time_total", row_limit=a.top, max_name_column_width=60))


if __name__ == "__main__":
    main()
