"""Weight sync from the training layout (TP=2) to the TP=1 layout a generation engine loads.

    python bench/weight_sync.py [--shapes 0.5b,1.5b] [--reps 5]

Two ranks (one GPU each, NCCL; gloo on CPU with TANDEM_BENCH_TINY=1) build a Qwen2.5-shaped
policy in bf16 at TP=2 and run tandem.convert.reshard.tp1_weights: TP shards all-gathered and
re-laid out (qkv groups, [gate; up]) into full TP=1 tensors on each GPU, both ways in the same
run: "bucketed" (the default: one all-gather per bucket of up to BUCKET_BYTES, then views)
and "per-parameter" (bucket_bytes=0, the former path: one all-gather per parameter). Printed
beside them, measured in the same run on the same GPUs: the device copy rate (bytes read +
written per second, one large device-to-device copy) and an NCCL all-gather of one flat
buffer of the model's size. Every run checks the two paths agree bit for bit. Rank 0 prints
a markdown table.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

SHAPES = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936),
}
TINY = os.environ.get("TANDEM_BENCH_TINY") or not torch.cuda.is_available()
if TINY:  # CPU smoke run
    SHAPES = {"tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=128, vocab_size=128)}


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
        shape = ModelShape(max_position_embeddings=4096, rope_theta=1e6, attention_bias=True,
                           tie_word_embeddings=True, **SHAPES[name])
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
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    import torch.multiprocessing as mp

    from tandem.parallel.layout import local_tcp_rendezvous

    rdzv = local_tcp_rendezvous()
    mp.spawn(rank_main, args=(rdzv, a.shapes.split(","), a.reps), nprocs=2, join=True)


if __name__ == "__main__":
    main()
