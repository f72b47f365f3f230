"""Weight sync benchmarks: the weight plane's transports, and the TP=2 -> TP=1 gather.

    python bench/weight_sync.py [--shapes 0.5b,1.5b,7b,14b] [--transports ipc,collective,stream] [--reps 3] [--out DIR]
    python bench/weight_sync.py --part gather [--shapes 0.5b,1.5b] [--reps 5]   # two GPUs (or CPU)

Transports (the default part): a source process (a model at the shape whose parameters are its
export, served by the library's WeightSource over gRPC) and a sink process (a one-rank rollout:
the library's WeightReceiver and WeightStaging) on the same GPU (ipc, stream) and, with two GPUs,
on the other one (collective = NCCL, stream); on CPU both on the host (stream, collective =
gloo; ipc = a shared-memory file on CPU). For each: seconds per sync (manifest, transfer, checks and the swap into the parameters)
and GB/s, beside what the same run measures in the sink process: the swap alone, the colocated
TP=1 copy (RolloutWorker.load_weights from TP=1 tensors on the same device: what a colocated
rollout's TP=1 copy does each generation), one device copy of the model's bytes, and a plain
TCP transfer on 127.0.0.1 between two processes (the stream's ceiling on one host). Every sync is
checked against the source's per-tensor byte sums. The ipc rows also get a per-phase table
(ShareWeights RPC, opening the shared buffer, the copy, the checks, the swap; the first sync
apart, which opens the handle). CPU (no CUDA, or TANDEM_BENCH_TINY=1): fp32 shapes cpu-small and
cpu-700mb. Rank 0 prints markdown tables; each shape runs in its own processes and is printed
when done (a failed shape is reported, the others still run).

Gather (--part gather): two ranks (one GPU each, NCCL; gloo on CPU) build a Qwen2.5-shaped
policy in bf16 at TP=2 and run tandem.convert.reshard.tp1_weights, "bucketed" (one all-gather per
bucket of up to BUCKET_BYTES, then views) and "per-parameter" (bucket_bytes=0), beside the device
copy rate and an NCCL all-gather of one flat buffer of the model's size, checked bit for bit.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

from weight_sync_transports import SHAPES as ALL_SHAPES  # noqa: E402 (bench/ is on sys.path)

SHAPES = {k: ALL_SHAPES[k] for k in ("0.5b", "1.5b")}  # the gather part
TINY = os.environ.get("TANDEM_BENCH_TINY") or not torch.cuda.is_available()
if TINY:  # CPU smoke run
    SHAPES = {"tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=128, vocab_size=128, tie_word_embeddings=True)}


def timed(fn, reps: int) -> float:
    from tandem.parallel import device

    fn()
    device.synchronize()
    torch.distributed.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    device.synchronize()
    return (time.perf_counter() - t0) / reps


def rank_main(rank: int, rdzv: str, shapes: list[str], reps: int) -> None:
    os.environ["LOCAL_RANK"] = str(rank)
    from tandem.convert.reshard import BUCKET_BYTES, tp1_weights
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape
    from tandem.parallel import device
    from tandem.parallel.layout import ParallelConfig, init_distributed

    init_distributed(ParallelConfig(tp=2), rank, 2, rdzv, seed=1)
    dtype = torch.float32 if TINY else torch.bfloat16
    rows = []
    for name in shapes:
        shape = ModelShape(max_position_embeddings=4096, rope_theta=1e6, attention_bias=True, **SHAPES[name])
        model = build_gpt_model(shape, tp=2, params_dtype=dtype)
        full, old = tp1_weights(model, shape), tp1_weights(model, shape, bucket_bytes=0)
        assert full.keys() == old.keys() and all(torch.equal(full[k], old[k]) for k in full)
        nbytes = sum(t.numel() * t.element_size() for t in full.values())
        del full, old
        sync_s = {path: timed(lambda: tp1_weights(model, shape, bucket_bytes=b), reps)
                  for path, b in (("bucketed", BUCKET_BYTES), ("per-parameter", 0))}
        src = torch.empty(nbytes, dtype=torch.uint8, device=device.device())
        dst = torch.empty_like(src)
        copy_s = timed(lambda: dst.copy_(src), reps)
        half = src[: nbytes // 2]
        gathered = [torch.empty_like(half) for _ in range(2)]
        gather_s = timed(lambda: torch.distributed.all_gather(gathered, half), reps)
        rows += [(name, path, nbytes, s, 2 * nbytes / copy_s, nbytes / gather_s) for path, s in sync_s.items()]
        del model, src, dst, half, gathered
        device.empty_cache()
    if rank == 0:
        import megatron.core

        gpus = (f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}" if torch.cuda.is_available()
                else "CPU (gloo)")
        print(f"\n- machine: {gpus}, torch {torch.__version__}, megatron-core {megatron.core.__version__}, "
              f"{str(dtype).removeprefix('torch.')} weights, TP=2 -> TP=1, mean of {reps} after a warm-up, "
              f"buckets of {BUCKET_BYTES / 2**20:.0f} MiB")
        print("\n| shape | path | model bytes | sync | sync GB/s | copy rate GB/s (read + write) | sync / copy rate "
              "| NCCL all-gather GB/s (same bytes) | sync / all-gather |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name, path, nbytes, sync_s, copy_rate, gather_rate in rows:
            rate = nbytes / sync_s
            print(f"| {name} | {path} | {nbytes / 1e9:.2f} GB | {sync_s * 1e3:.1f} ms | {rate / 1e9:.0f} | "
                  f"{copy_rate / 1e9:.0f} | {rate / copy_rate:.2f} | {gather_rate / 1e9:.0f} | {rate / gather_rate:.2f} |")
    torch.distributed.barrier()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["transports", "gather"], default="transports")
    p.add_argument("--shapes", help="default: 0.5b,1.5b,7b,14b (transports on GPU), cpu-small,cpu-700mb (CPU)")
    p.add_argument("--transports", default="ipc,collective,stream")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunk-mb", type=float, default=1.0, help="stream chunk (weight_sync.chunk_mb)")
    p.add_argument("--bucket-mb", type=int, default=256, help="collective bucket (weight_sync.bucket_mb)")
    p.add_argument("--streams", type=int, default=2, help="parallel streams (weight_sync.streams)")
    p.add_argument("--out", help="also write the results as JSON into this directory")
    a = p.parse_args()
    if a.part == "transports":
        from weight_sync_transports import run_transports

        run_transports(a)
        return
    import torch.multiprocessing as mp

    from tandem.parallel.layout import local_tcp_rendezvous

    rdzv = local_tcp_rendezvous()
    mp.spawn(rank_main, args=(rdzv, (a.shapes or ",".join(SHAPES)).split(","), a.reps), nprocs=2, join=True)


if __name__ == "__main__":
    main()
