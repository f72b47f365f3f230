"""One rank of a Hugging Face import at pipeline_model_parallel_size=2 (two gloo processes), launched by
tests/multirank/test_hf_convert_tp2.py.

usage: python tests/helpers/hf_pp_rank.py RANK tcp://HOST:PORT HF_DIR [HF_DIR ...]

Each stage loads its half of the layers (and the embedding, or the final norm and output layer);
the stages' weights, gathered into the TP=1 PP=1 layout (the colocated rollout's sync), must equal
every parameter of the whole model loaded on one rank. Exit code 0 = pass.
"""
import json
import os
import sys

import torch
from actor_runs import assert_same_weights

from tandem.process_exit import exit_process


def main() -> int:
    rank, init_method, hf_dirs = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    from tandem.convert.hf_load import load_hf_weights
    from tandem.convert.reshard import tp1_weights
    from tandem.models.build import build_gpt_model
    from tandem.models.registry import shape_from_hf_config
    from tandem.parallel.layout import ParallelConfig, init_distributed

    init_distributed(ParallelConfig(pp=2), rank, 2, init_method, seed=1)
    for hf_dir in hf_dirs:
        with open(os.path.join(hf_dir, "config.json")) as f:
            shape = shape_from_hf_config(json.load(f))
        stage = build_gpt_model(shape, pp=2)
        loaded = load_hf_weights(stage, hf_dir, shape, tp_rank=0, tp_size=1)
        assert loaded == {n for n, _ in stage.named_parameters()}
        gathered = tp1_weights(stage, shape)
        whole = build_gpt_model(shape, replica=True)
        load_hf_weights(whole, hf_dir, shape, tp_rank=0, tp_size=1)
        assert_same_weights(gathered, {k: v.detach() for k, v in whole.named_parameters()}, atol=0)
        print(f"{hf_dir}: stage {rank} loaded {len(loaded)} tensors; the stages equal the whole model", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_process(main())  # without the interpreter's teardown (seconds per rank)
