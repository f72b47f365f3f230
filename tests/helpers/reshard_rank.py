"""One rank of tests/multirank/test_weight_sync.py: tp1_weights at TP x EP over 2 gloo ranks.

usage: python tests/helpers/reshard_rank.py RANK TP EP RENDEZVOUS HF_DIR [HF_DIR ...]

For each checkpoint every rank loads its shards and checks that tp1_weights with the default
buckets, with 4 KiB buckets (many buckets) and on the per-parameter path (bucket_bytes=0) give
the same names, in the same order, and bit-identical tensors, equal to the TP=1 megatron
tensors built straight from the checkpoint's file. A failure raises (non-zero exit).
"""
import json
import os
import sys

import torch

from tandem.process_exit import exit_process


def main() -> int:
    rank, tp, ep = (int(a) for a in sys.argv[1:4])
    rdzv, hf_dirs = sys.argv[4], sys.argv[5:]
    from megatron.core import parallel_state as ps
    from safetensors.torch import load_file

    from tandem.convert.hf_load import load_hf_weights
    from tandem.convert.reshard import tp1_weights
    from tandem.models.build import build_gpt_model
    from tandem.models.registry import shape_from_hf_config, weight_mappings
    from tandem.parallel.layout import ParallelConfig, init_distributed

    init_distributed(ParallelConfig(tp=tp, ep=ep), rank, 2, rdzv, seed=1)
    for hf_dir in hf_dirs:
        with open(os.path.join(hf_dir, "config.json")) as f:
            shape = shape_from_hf_config(json.load(f))
        model = build_gpt_model(shape, tp=tp, ep=ep, sequence_parallel=shape.moe is not None)
        load_hf_weights(model, hf_dir, shape, ps.get_tensor_model_parallel_rank(), tp)
        hf = load_file(os.path.join(hf_dir, "model.safetensors"))
        want = {m.megatron: m.shard(hf, 0, 1) for m in weight_mappings(shape)}
        runs = {b: tp1_weights(model, shape, bucket_bytes=b) for b in (1 << 30, 4096, 0)}
        for b, got in runs.items():
            assert list(got) == list(want), (b, sorted(set(got) ^ set(want)))
            bad = [k for k in want if got[k].dtype != want[k].dtype or not torch.equal(got[k], want[k])]
            assert not bad, (hf_dir, b, bad)
        print(f"{hf_dir}: tp={tp} ep={ep} rank {rank}: {len(want)} tensors bit-identical", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_process(main())  # without the interpreter's teardown (seconds per rank)
