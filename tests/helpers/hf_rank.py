"""One rank of a Hugging Face conversion test over 2 processes (gloo) at TP x EP, launched by
tests/unit/test_hf_convert.py (Llama / Qwen2 at TP=2) and test_moe_convert.py (Qwen3-MoE at
EP=2 and at TP=2).

usage: python tests/helpers/hf_rank.py RANK TP EP tcp://HOST:PORT OUT_DIR HF_DIR [HF_DIR ...]

World size 2 = TP x DP; experts are split over EP ranks (megatron carves EP out of DP x TP).
For each checkpoint: load this rank's shard (its experts only at EP=2), run the same tokens
on every rank, gather logits over the vocab; rank 0 compares them with transformers'
(atol 1e-4, fp32). Then export (gathered over TP and EP) and rank 0 checks every tensor is
bit-identical to the original. Exit code 0 = pass.
"""
import json
import os
import sys

import torch
from hf_test_files import hf_tensors

from tandem.process_exit import exit_process


def main() -> int:
    rank, tp, ep = (int(a) for a in sys.argv[1:4])
    init_method, out_dir, hf_dirs = sys.argv[4], sys.argv[5], sys.argv[6:]
    from megatron.core import parallel_state

    from tandem.convert.hf_export import export_hf
    from tandem.convert.hf_load import load_hf_weights
    from tandem.models.build import build_gpt_model
    from tandem.models.forward import forward_logits
    from tandem.models.logprobs import gather_vocab
    from tandem.models.registry import architecture_of, shape_from_hf_config
    from tandem.parallel.layout import ParallelConfig, init_distributed

    init_distributed(ParallelConfig(tp=tp, ep=ep), rank, 2, init_method, seed=1)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    for i, hf_dir in enumerate(hf_dirs):
        with open(os.path.join(hf_dir, "config.json")) as f:
            config = json.load(f)
        shape = shape_from_hf_config(config)
        model = build_gpt_model(shape, tp=tp, ep=ep)
        loaded = load_hf_weights(model, hf_dir, shape, tp_rank=tp_rank, tp_size=tp)
        assert loaded == {n for n, _ in model.named_parameters()}
        ids = torch.randint(0, shape.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
        model.eval()
        with torch.no_grad():
            logits = gather_vocab(forward_logits(model, ids, torch.ones_like(ids)))
        if rank == 0:
            from transformers import AutoModelForCausalLM

            hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
            with torch.no_grad():
                want = hf(ids).logits
            err = (logits - want).abs().max().item()
            print(f"{hf_dir} tp={tp} ep={ep}: max |logits - hf| = {err:.3g}", flush=True)
            assert logits.shape == want.shape and err < 1e-4, err
        out = os.path.join(out_dir, f"export{i}")
        export_hf(model, shape, out, architecture_of(config))
        torch.distributed.barrier()
        if rank == 0:
            a, b = hf_tensors(hf_dir), hf_tensors(out)
            assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
            bad = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
            assert not bad, bad
            print(f"{hf_dir}: round trip at tp={tp} ep={ep} bit-exact ({len(a)} tensors)", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_process(main())  # without the interpreter's teardown (seconds per rank)
