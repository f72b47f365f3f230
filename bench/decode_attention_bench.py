"""Decode attention alone on the GPU: the runner's SDPA path against decode_attention.py.

For the Qwen2.5-0.5B / 1.5B attention layouts (2 KV heads; 14 / 12 query heads; head
dim 64 / 128), bf16, every slot at position kv_len - 1 (the whole bucket is context):
  sdpa    the runner before: K and V scattered into the cache (two kernels), then cuDNN
          SDPA over the first kv_len positions under a bool length mask (built once a step)
  triton  decode_attention.decode_attention: writes K and V itself, split-K over the context
Each variant is checked against an fp32 SDPA of the same cache (max abs difference,
cache contents), then timed as a CUDA graph of one call per layer over `--layers`
layers (so K and V come from HBM, not L2); `--prefix P --n N`: also the prefix ("cascade")
kernel with each N consecutive slots one prompt group sharing its first P positions (triton_prefix,
its difference from the plain kernel, and its speed-up over it; triton_prefix_first: the same with the
prompt's programs first in the grid order); printed: us per layer, the K + V bytes
read per second and, as same-run ratios, triton's speed-up over sdpa and each variant's read
rate against the device copy rate measured at the start (bench/generation_bench.py's). `--sweep` also times the kernel over splits x block_n x warps x stages.

    python bench/decode_attention_bench.py [--batches 64,256] [--kv-len 768] [--sweep] [--prefix 192 --n 8]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from generation_bench import copy_rate  # noqa: E402

from tandem.generation import decode_attention as da  # noqa: E402
from tandem.generation.kv_cache import KVCache  # noqa: E402
from tandem.generation.prefix_groups import PrefixGroups  # noqa: E402

LAYOUTS = {"0.5b": (2, 7, 64), "1.5b": (2, 6, 128)}  # (kv heads, q heads per kv head, head dim)
OUT = os.environ.get("OUT", ".")


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)
    with open(os.path.join(OUT, "decode_attention_bench.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def graph_us(fn, reps: int = 20) -> float:
    """Microseconds per call of fn, replayed as a CUDA graph."""
    fn()  # compiles / picks kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def case(name, batch, kv_len, layers, sweep, rate, prefix=0, n=1) -> None:
    groups, qpg, d = LAYOUTS[name]
    dev, dtype, scale = torch.device("cuda"), torch.bfloat16, d ** -0.5
    torch.manual_seed(batch)
    cache = KVCache.allocate(layers, batch, groups, 1024, d, dtype, dev)
    cache.k.normal_()
    cache.v.normal_()
    q = torch.randn(layers, batch, groups, qpg, d, device=dev, dtype=dtype)
    kv = torch.randn(layers, batch, groups, 2, d, device=dev, dtype=dtype)  # strided k and v, like the qkv split's
    pos = torch.full((batch,), kv_len - 1, device=dev)
    key_pos = torch.arange(1024, device=dev)

    def sdpa_step():
        allowed = (key_pos[:kv_len][None] <= pos[:, None])[:, None, None]
        for i in range(layers):
            cache.write_decode(i, batch, pos, kv[i, :, :, 0], kv[i, :, :, 1])
            F.scaled_dot_product_attention(q[i], cache.k[i, :, :, :kv_len], cache.v[i, :, :, :kv_len],
                                           attn_mask=allowed, scale=scale)

    def kernel_step(**kw):
        for i in range(layers):
            da.decode_attention(q[i], kv[i, :, :, 0], kv[i, :, :, 1], cache.k[i], cache.v[i], pos, kv_len,
                                scale, **kw)

    # correctness: layer 0, against fp32 SDPA after the kernel wrote the new rows
    out = da.decode_attention(q[0], kv[0, :, :, 0], kv[0, :, :, 1], cache.k[0], cache.v[0], pos, kv_len, scale)
    written = bool(torch.equal(cache.k[0, :, :, kv_len - 1], kv[0, :, :, 0])
                   and torch.equal(cache.v[0, :, :, kv_len - 1], kv[0, :, :, 1]))
    ref = F.scaled_dot_product_attention(q[0].float(), cache.k[0, :, :, :kv_len].float(),
                                         cache.v[0, :, :, :kv_len].float(), scale=scale)
    sdpa_bf16 = F.scaled_dot_product_attention(q[0], cache.k[0, :, :, :kv_len], cache.v[0, :, :, :kv_len],
                                               scale=scale)
    kv_bytes = 2 * batch * groups * kv_len * d * 2
    rec = {"shape": name, "batch": batch, "kv_len": kv_len, "layers": layers,
           "splits_default": da.num_splits(batch, groups, kv_len, da._sm_count(dev)),
           "max_abs_diff_vs_fp32": float((out.float() - ref).abs().max()),
           "sdpa_bf16_max_abs_diff_vs_fp32": float((sdpa_bf16.float() - ref).abs().max()),
           "cache_written": written}
    variants = [("sdpa", sdpa_step), ("triton", kernel_step)]
    if prefix:  # groups of n consecutive slots share positions < prefix (the prefill's copies)
        groups_ = PrefixGroups(batch, n, dev)
        groups_.admit([(tuple(range(s, s + n)), prefix) for s in range(0, batch - n + 1, n)])
        first = torch.arange(batch, device=dev) // n * n
        cache.k[:, :, :, :prefix] = cache.k[:, first, :, :prefix]
        cache.v[:, :, :, :prefix] = cache.v[:, first, :, :prefix]
        shared = da.decode_attention(q[0], kv[0, :, :, 0], kv[0, :, :, 1], cache.k[0], cache.v[0], pos, kv_len,
                                     scale, prefix=groups_.tensors())
        plain = da.decode_attention(q[0], kv[0, :, :, 0], kv[0, :, :, 1], cache.k[0], cache.v[0], pos, kv_len, scale)
        rec["prefix_max_abs_diff_vs_plain"] = float((shared.float() - plain.float()).abs().max())
        variants.append(("triton_prefix", lambda: kernel_step(prefix=groups_.tensors())))
        variants.append(("triton_prefix_first", lambda: kernel_step(prefix=groups_.tensors(), prompt_first=True)))
    for variant, fn in variants:
        us = graph_us(fn) / layers
        rec[f"{variant}_us_per_layer"] = us
        rec[f"{variant}_TBps"] = kv_bytes / us / 1e6
        rec[f"{variant}_read_share_of_copy_rate"] = kv_bytes / (us / 1e6) / rate  # read rate / (read + write) rate
    rec["triton_speedup_vs_sdpa"] = rec["sdpa_us_per_layer"] / rec["triton_us_per_layer"]
    if prefix:
        rec["prefix_speedup_vs_triton"] = rec["triton_us_per_layer"] / rec["triton_prefix_us_per_layer"]
        rec["prefix_first_speedup_vs_triton"] = rec["triton_us_per_layer"] / rec["triton_prefix_first_us_per_layer"]
    emit(rec)
    if sweep:
        rows = []
        for splits, block_n, warps, stages in itertools.product((1, 2, 3, 4), (32, 64, 128), (4, 8), (2, 3)):
            if splits > 1 and -(-kv_len // splits) < block_n:
                continue
            us = graph_us(lambda: kernel_step(splits=splits, block_n=block_n, num_warps=warps,
                                              num_stages=stages)) / layers
            rows.append((us, splits, block_n, warps, stages))
        rows.sort()
        emit({"sweep": name, "batch": batch, "kv_len": kv_len, "best": [
            {"us": r[0], "TBps": kv_bytes / r[0] / 1e6, "splits": r[1], "block_n": r[2], "warps": r[3],
             "stages": r[4]} for r in rows[:6]]})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="0.5b,1.5b")
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--kv-len", type=int, default=768)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--prefix", type=int, default=0, help="shared prompt positions per group (0: no prefix case)")
    ap.add_argument("--n", type=int, default=8, help="slots per prompt group with --prefix")
    args = ap.parse_args()
    rate = copy_rate()
    emit({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
          "triton": __import__("triton").__version__, "copy_rate_GBps": rate / 1e9})
    for name in args.shapes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            case(name, batch, args.kv_len, args.layers, args.sweep, rate, args.prefix, args.n)


if __name__ == "__main__":
    main()
