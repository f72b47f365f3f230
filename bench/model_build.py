"""What building a model costs at a service's start, with and without drawing random weights that a
checkpoint (or the policy, for the reference) overwrites: `build_gpt_model(weights_follow=...)`;
with --load, what loading its Hugging Face checkpoint costs: `load_hf_weights` with its parallel
readers (one thread per safetensors file) against the same function with one reader.

    python bench/model_build.py --shape 0.5b --repeats 3      # CPU (fp32) or GPU (bf16)
    python bench/model_build.py --load --shape 0.5b --shard-gb 0.125 --repeats 3

One process, a build (or load) not counted (imports, first allocations, the files into the page
cache), then the two alternating --repeats times; prints each one's median seconds and the ratio
(weights_follow / random init; parallel readers / one reader), with the machine. --load writes a
random bf16 checkpoint of the shape (bench/make_checkpoint.py) in --shard-gb files under the temp
dir (kept for the next run) and loads it into one model built with weights_follow.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from make_checkpoint import SHAPES as CHECKPOINT_SHAPES  # noqa: E402
from make_checkpoint import make_checkpoint  # noqa: E402
from weight_sync_transports import SHAPES  # noqa: E402

from tandem.convert.hf_load import READERS, hf_safetensors_files, load_hf_weights  # noqa: E402
from tandem.models.build import build_gpt_model  # noqa: E402
from tandem.models.registry import read_hf_config, shape_from_hf_config  # noqa: E402
from tandem.models.spec import ModelShape  # noqa: E402
from tandem.parallel import device  # noqa: E402
from tandem.parallel.layout import ParallelConfig, init_distributed  # noqa: E402


def timed(fn) -> float:
    if device.has_cuda():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device.has_cuda():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def timed_build(shape: ModelShape, dtype: torch.dtype, weights_follow: bool) -> float:
    return timed(lambda: build_gpt_model(shape, params_dtype=dtype, weights_follow=weights_follow))


def alternate(repeats: int, runs: dict) -> dict:
    """{name: [seconds] over `repeats` rounds}: each round runs every one, in the dict's order."""
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            times[name].append(run())
    return times


def report(title: str, times: dict, ratio: tuple[str, str]) -> None:
    where = torch.cuda.get_device_name() if device.has_cuda() else f"{platform.machine()} CPU, {os.cpu_count()} cores"
    print(f"{title}, {where}, torch {torch.__version__}, load average {os.getloadavg()[0]:.1f}; "
          f"medians of {len(next(iter(times.values())))}")
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"  {name}: {med[name]:.2f} s {['%.2f' % x for x in t]}")
    print(f"  ratio {ratio[0]} / {ratio[1]}: {med[ratio[0]] / med[ratio[1]]:.3f}")


def bench_build(a, dtype: torch.dtype) -> None:
    shape = ModelShape(max_position_embeddings=4096, rope_theta=1e6, attention_bias=True, **SHAPES[a.shape])
    timed_build(shape, dtype, True)  # imports and first allocations, counted in neither
    times = alternate(a.repeats, {"random init": lambda: timed_build(shape, dtype, False),
                                  "weights_follow": lambda: timed_build(shape, dtype, True)})
    report(f"model build, {a.shape} ({dtype})", times, ("weights_follow", "random init"))


def bench_load(a, dtype: torch.dtype) -> None:
    hf_dir = os.path.join(tempfile.gettempdir(), f"tandem-qwen-{a.shape}-{a.shard_gb:g}gb")
    info = make_checkpoint(hf_dir, a.shape, shard_gb=a.shard_gb)
    files = len(hf_safetensors_files(hf_dir))
    shape = shape_from_hf_config(read_hf_config(hf_dir))
    model = build_gpt_model(shape, params_dtype=dtype, weights_follow=True)

    def load(readers: int | None):
        return lambda: timed(lambda: load_hf_weights(model, hf_dir, shape, 0, 1, readers=readers))

    load(None)()  # imports, first touches, the files into the page cache: counted in neither
    times = alternate(a.repeats, {"one reader": load(1), f"{min(files, READERS)} readers": load(None)})
    report(f"load_hf_weights, {a.shape}: {info['bytes'] / 1e9:.2f} GB bf16 in {files} files -> {dtype} parameters",
           times, (f"{min(files, READERS)} readers", "one reader"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="0.5b", choices=sorted(set(SHAPES) | set(CHECKPOINT_SHAPES)))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--load", action="store_true", help="time load_hf_weights instead of the build")
    p.add_argument("--shard-gb", type=float, default=0.125, help="--load: size of each checkpoint file")
    a = p.parse_args()
    shapes = CHECKPOINT_SHAPES if a.load else SHAPES
    if a.shape not in shapes:
        p.error(f"--shape is one of {sorted(shapes)}{' with --load (bench/make_checkpoint.py)' * a.load}")
    init_distributed(ParallelConfig(), 0, 1)
    dtype = torch.bfloat16 if device.has_cuda() else torch.float32
    (bench_load if a.load else bench_build)(a, dtype)


if __name__ == "__main__":
    main()
