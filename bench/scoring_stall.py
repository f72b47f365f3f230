"""How long the controller's event loop stalls while a step's rows are prepared for scoring, on the CPU.

    python bench/scoring_stall.py [--rows 512] [--tokens 512] [--repeats 5]

controller/scoring.score decodes every response to text before the Score call (e2e_step's batch:
512 rows of 512 tokens, the built-in task's character tokenizer). With trainer.log_probs_with_scoring
the step's log-prob call starts at the same moment; on the event loop, the decode held that call's
request back while the GPU waited for it (issue 23: the largest GPU gap of the step follows
generation). Measured here, with the real tokenizer and controller code: the longest time a 1 ms
ticker on the loop was held up while the request was built inline (the code before) and in a worker
thread (scoring.score now), median of --repeats, and their ratio. No server: the Score call itself
awaits without holding the loop in either case.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tandem.config import load_config  # noqa: E402
from tandem.controller import scoring  # noqa: E402
from tandem.data.batch import DataProto  # noqa: E402
from tandem.tasks.arithmetic import build_tokenizer  # noqa: E402
from tandem.tokenizer import load_tokenizer  # noqa: E402


async def longest_stall(build) -> float:
    """Seconds of the longest gap between a 1 ms ticker's wake-ups while `build()` runs."""
    wakes = [time.perf_counter()]
    stop = asyncio.Event()

    async def ticker():
        while not stop.is_set():
            await asyncio.sleep(0.001)
            wakes.append(time.perf_counter())

    tick = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.01)
    await build()
    stop.set()
    await tick
    return max(b - a for a, b in zip(wakes, wakes[1:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    tokenizer = load_tokenizer(build_tokenizer(os.path.join(tempfile.mkdtemp(), "tok")))
    g = torch.Generator().manual_seed(0)
    gen = DataProto(tensors={"responses": torch.randint(3, len(tokenizer), (a.rows, a.tokens), generator=g),
                             "response_mask": torch.ones(a.rows, a.tokens, dtype=torch.long)},
                    columns={"ground_truth": ["1"] * a.rows, "data_source": ["arithmetic"] * a.rows})
    cfg = load_config(None, [])

    async def inline():
        scoring.reward_request(gen, tokenizer, cfg)

    async def threaded():
        await asyncio.to_thread(scoring.reward_request, gen, scoring.thread_decoder(tokenizer), cfg)

    out = {}
    for name, build in (("inline (before)", inline), ("worker thread (scoring.score)", threaded)):
        out[name] = statistics.median(asyncio.run(longest_stall(build)) for _ in range(a.repeats))
    print(f"scoring_stall: {a.rows} rows x {a.tokens} tokens, {platform.machine()} {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}")
    for name, s in out.items():
        print(f"  {name}: the event loop's longest stall {s * 1e3:.1f} ms")
    before, after = out.values()
    print(f"  ratio (thread / inline): {after / before:.3f}")


if __name__ == "__main__":
    main()
