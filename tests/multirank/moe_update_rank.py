"""One rank of the MoE update test: one Adam step at expert parallel EP = world size (gloo).

usage: python tests/multirank/moe_update_rank.py RANK WORLD INIT_FILE OUT_DIR HF_DIR

Loads the Qwen3-MoE HF checkpoint, takes one optimizer step on a next-token loss over fixed
rows (split over the DP ranks) through the actor's megatron DDP and optimizer
(tandem/train/optim.py) with megatron's finalize_model_grads (per-token loss: gradients summed
over DP, divided by the global token count), and exports the updated weights to OUT_DIR.
"""
import json
import os
import sys

import torch


def main() -> int:
    rank, world = int(sys.argv[1]), int(sys.argv[2])
    init_file, out_dir, hf_dir = sys.argv[3:6]
    from tandem.config import OptimConfig
    from tandem.convert.hf_config import shape_from_hf_config
    from tandem.convert.hf_export import export_hf
    from tandem.convert.hf_load import load_hf_weights
    from tandem.dist.parallel import ParallelConfig, init_distributed
    from megatron.core.distributed import finalize_model_grads

    from tandem.models.build import build_gpt_model
    from tandem.models.forward import forward_logits
    from tandem.train.optim import Optimizer, wrap_ddp

    init_distributed(ParallelConfig(ep=world), rank, world, f"file://{init_file}", seed=1)
    with open(os.path.join(hf_dir, "config.json")) as f:
        shape = shape_from_hf_config(json.load(f))
    model = build_gpt_model(shape, ep=world)
    load_hf_weights(model, hf_dir, shape, tp_rank=0, tp_size=1)
    ddp = wrap_ddp(model)
    opt = Optimizer(ddp, OptimConfig(lr=1e-3, lr_warmup_steps=0))
    ids = torch.randint(0, shape.vocab_size, (4, 12), generator=torch.Generator().manual_seed(0))
    rows = ids.chunk(world)[rank]  # data parallel: each rank its rows; experts see every rank's tokens

    ddp.train()
    opt.zero_grad()
    logits = forward_logits(ddp, rows, torch.ones_like(rows))
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, rows[:, 1:, None]).squeeze(-1)
    (-logp.sum()).backward()
    finalize_model_grads([ddp], num_tokens=torch.tensor(logp.numel(), dtype=torch.int))
    grad_norm = opt.step()
    export_hf(model, shape, out_dir, "Qwen3MoeForCausalLM")
    if rank == 0:
        print(f"world={world} grad_norm={grad_norm:.6f}", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
