"""One rank of the TP=2 HF conversion test (launched twice by test_hf_convert.py).

usage: python tests/unit/hf_tp2_worker.py RANK INIT_FILE OUT_DIR HF_DIR [HF_DIR ...]

For each HF checkpoint dir: load this rank's shard, run the model on fixed tokens, gather
logits over the vocab; rank 0 compares them with transformers' logits (atol 1e-4). Then
export back to HF (gathered over TP) and rank 0 checks every tensor is bit-identical to the
original. Exit code 0 = pass; a failing check raises (non-zero exit).
"""
import os
import sys

import torch


def hf_tensors(d: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for name in sorted(os.listdir(d)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, name)))
    return out


def main() -> int:
    rank, init_file, out_dir, hf_dirs = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
    from tandem.convert.hf_config import architecture_of, shape_from_hf_config
    from tandem.convert.hf_export import export_hf
    from tandem.convert.hf_load import load_hf_weights
    from tandem.dist.parallel import ParallelConfig, init_distributed
    from tandem.models.build import build_gpt_model
    from tandem.models.forward import forward_logits
    from tandem.models.logprobs import gather_vocab

    init_distributed(ParallelConfig(tp=2), rank, 2, f"file://{init_file}", seed=1)
    import json

    for i, hf_dir in enumerate(hf_dirs):
        with open(os.path.join(hf_dir, "config.json")) as f:
            config = json.load(f)
        shape = shape_from_hf_config(config)
        model = build_gpt_model(shape, tp=2)
        loaded = load_hf_weights(model, hf_dir, shape, tp_rank=rank, tp_size=2)
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
            print(f"{hf_dir}: max |logits - hf| = {err:.3g}", flush=True)
            assert logits.shape == want.shape and err < 1e-4, err
        out = os.path.join(out_dir, f"export{i}")
        export_hf(model, shape, out, architecture_of(config))
        torch.distributed.barrier()
        if rank == 0:
            a, b = hf_tensors(hf_dir), hf_tensors(out)
            assert a.keys() == b.keys(), (sorted(a.keys() ^ b.keys()))
            bad = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
            assert not bad, bad
            print(f"{hf_dir}: round trip at tp=2 bit-exact ({len(a)} tensors)", flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
