"""Export a run's actor checkpoint as a Hugging Face directory (safetensors, config.json, tokenizer).

    python -m tandem.services.actor.export RUN_DIR/checkpoints/global_step_N OUT_DIR

The checkpoint may have been saved at any TP / DP layout (dist_checkpointing reshards on
load); the export runs in this process on one rank, on the CPU or one GPU. The
architecture is the source checkpoint's (actor_rollout_ref.model.path), else Llama.
"""
from __future__ import annotations

import argparse
import os
import sys


def export(step_dir: str, out_dir: str) -> str:
    from transformers import AutoTokenizer

    from tandem.config import load_config
    from tandem.parallel.layout import ParallelConfig, init_distributed
    from tandem.services.actor.front import ActorFront

    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(step_dir)))
    cfg = load_config(os.path.join(run_dir, "config.yaml"),
                      ["services.actor.world_size=1",  # one rank here, whatever the run used
                       "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
                       "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1"])
    init_distributed(ParallelConfig(), 0, 1, seed=1)
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path)
    actor = ActorFront.in_process(cfg, len(tokenizer))
    actor.load(os.path.join(step_dir, "actor"))
    return actor.export_hf(out_dir)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.services.actor.export", description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a run's checkpoints/global_step_N directory")
    p.add_argument("out_dir")
    a = p.parse_args(argv)
    if not os.path.isdir(os.path.join(a.checkpoint, "actor")):
        print(f"checkpoint: {a.checkpoint!r} has no actor/ directory (expected RUN/checkpoints/global_step_N)",
              file=sys.stderr)
        return 2
    print(export(a.checkpoint, a.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
