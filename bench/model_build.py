"""What building a model costs at a service's start, with and without drawing random weights that a
checkpoint (or the policy, for the reference) overwrites: `build_gpt_model(weights_follow=...)`.

    python bench/model_build.py --shape 0.5b --repeats 3      # CPU (fp32) or GPU (bf16)

One process, a build not counted (imports, first allocations), then the two alternating --repeats times; prints each build's median seconds and the
ratio (weights_follow / random init), with the machine.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from weight_sync_transports import SHAPES  # noqa: E402

from tandem.models.build import build_gpt_model  # noqa: E402
from tandem.models.spec import ModelShape  # noqa: E402
from tandem.parallel import device  # noqa: E402
from tandem.parallel.layout import ParallelConfig, init_distributed  # noqa: E402


def timed_build(shape: ModelShape, dtype: torch.dtype, weights_follow: bool) -> float:
    if device.has_cuda():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    model = build_gpt_model(shape, params_dtype=dtype, weights_follow=weights_follow)
    if device.has_cuda():
        torch.cuda.synchronize()
    spent = time.perf_counter() - t0
    del model
    return spent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    init_distributed(ParallelConfig(), 0, 1)
    shape = ModelShape(max_position_embeddings=4096, rope_theta=1e6, attention_bias=True, **SHAPES[a.shape])
    dtype = torch.bfloat16 if device.has_cuda() else torch.float32
    timed_build(shape, dtype, True)  # imports and first allocations, counted in neither
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(a.repeats):
        for follow in (False, True):
            times[follow].append(timed_build(shape, dtype, follow))
    init, follow = statistics.median(times[False]), statistics.median(times[True])
    where = torch.cuda.get_device_name() if device.has_cuda() else f"{platform.machine()} CPU, {os.cpu_count()} cores"
    print(f"model build, {a.shape} ({dtype}), {where}, torch {torch.__version__}; medians of {a.repeats}")
    print(f"  random init: {init:.2f} s {['%.2f' % t for t in times[False]]}")
    print(f"  weights_follow: {follow:.2f} s {['%.2f' % t for t in times[True]]}")
    print(f"  ratio weights_follow / random init: {follow / init:.3f}")


if __name__ == "__main__":
    main()
