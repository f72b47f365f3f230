"""The decode step's unfiltered sampler (sampling._draw_full, compiled as the engine compiles
it) by block size: time per call on [batch, 151,936] bf16 logits, against the default block.

    python bench/sampler_bench.py [--batch 256] [--blocks 2048,1024,512,256]

The two-level inverse CDF reads the logits once for per-block maxima and exp-sums; the
block size decides how inductor lays out that reduction (a persistent or a looped
reduction, and how much padding: 151,936 = 2^7 x 1187). Timed in a CUDA graph of 20 calls,
as the engine replays it. Prints ms per call, the speed-up over the first block size, and
the share of draws equal to the first block size's (same uniforms).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tandem.generation.sampling import _draw_full, counter_uniform  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--blocks", default="2048,1024,512,256")
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(args.batch, args.vocab, device="cuda", generator=g) * 3).to(torch.bfloat16)
    rows = torch.arange(args.batch, device="cuda")
    seed = torch.tensor(7, device="cuda")
    print(f"- machine: {torch.cuda.get_device_name()}, torch {torch.__version__}; logits {args.batch} x {args.vocab} bf16")
    print("\n| block | ms per draw | speed vs first | draws equal to first |")
    print("| ---: | ---: | ---: | ---: |")
    first = base = None
    for block in (int(b) for b in args.blocks.split(",")):
        fn = torch.compile(lambda z, u, block=block: _draw_full(z.float(), u, block=block), fullgraph=True)
        step = torch.zeros(args.batch, dtype=torch.long, device="cuda")
        u = counter_uniform(seed, rows, step)
        tok, _ = fn(logits, u)
        for _ in range(5):
            fn(logits, u)
        graph = torch.cuda.CUDAGraph()  # as in the engine: launch costs out of the figure
        with torch.cuda.graph(graph):
            for _ in range(20):
                fn(logits, u)
        graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.reps // 20):
            graph.replay()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / (args.reps // 20 * 20)
        first = tok if first is None else first
        base = base or dt
        print(f"| {block} | {dt * 1e3:.4f} | {base / dt:.2f} | {(tok == first).float().mean().item():.4f} |",
              flush=True)


if __name__ == "__main__":
    main()
