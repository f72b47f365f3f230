"""A Qwen3-MoE imported from Hugging Face at expert parallel 1 and 2, against transformers.

    python bench/moe_ep.py                    # GPUs: NCCL, fp32 and bf16, EP=1 (1 GPU) and EP=2 (2 GPUs)
    TANDEM_BENCH_TINY=1 python bench/moe_ep.py  # CPU smoke run over gloo (also the default without CUDA)

A random Qwen3-MoE is built locally with transformers (nothing downloaded) and saved with
save_pretrained. Per dtype and EP, `EP` ranks (one process per GPU, torch.multiprocessing spawn)
build the megatron-core GPTModel, load their experts (each EP rank holds num_experts / EP),
and run the same tokens (experts reached by alltoall token dispatch). Rank 0's logits are
compared with transformers' at the same dtype and with transformers' fp32 logits (the truth).
At fp32 the export back to HF is also checked bit-exact.

Pass: fp32: max |tandem - hf_fp32| < FP32_TOL. bf16: max |tandem - hf_fp32| is at most
BF16_FACTOR x transformers' own bf16 error max |hf_bf16 - hf_fp32| (+ BF16_SLACK): bf16
rounding (and a near-tied router choice it flips) differs between implementations, so the
yardstick is transformers' own error. Exit code 1 if any row fails.
"""
from __future__ import annotations

import os
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from anywhere

TINY = bool(os.environ.get("TANDEM_BENCH_TINY")) or not torch.cuda.is_available()
FP32_TOL, BF16_FACTOR, BF16_SLACK = 1e-4, 2.0, 1e-2
# Qwen3-30B-A3B's proportions, scaled down: head_dim != hidden/heads, top-8 of 32 experts.
CONFIG = dict(vocab_size=4096, hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
              head_dim=128, intermediate_size=1024, moe_intermediate_size=256, num_experts=32,
              num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=512, rms_norm_eps=1e-6,
              tie_word_embeddings=False, initializer_range=0.05)
BATCH, SEQ = 4, 128
if TINY:
    CONFIG.update(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=32, intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                  max_position_embeddings=64, initializer_range=0.1)
    BATCH, SEQ = 2, 12
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_hf(path: str) -> str:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**CONFIG))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)  # a swapped q/k norm must show
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0, 0.1)  # peaked enough that routing matters
    model.save_pretrained(path, safe_serialization=True)
    return path


def tokens() -> torch.Tensor:
    return torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(0))


def hf_logits(hf_dir: str, dtype: torch.dtype) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    # eager experts: transformers' per-expert loop, the reference implementation (no grouped_mm kernel)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype, attn_implementation="eager",
                                                 experts_implementation="eager").to(dev).eval()
    with torch.no_grad():
        return model(tokens().to(dev)).logits.float().cpu()


def rank_main(rank: int, world: int, hf_dir: str, dtype_name: str, work: str, rdzv: str) -> None:
    """One rank: import at EP=world, save rank 0's logits, check the fp32 export on rank 0."""
    import json

    from safetensors.torch import load_file

    from tandem.convert.hf_export import export_hf
    from tandem.convert.hf_load import load_hf_weights
    from tandem.models.build import build_gpt_model
    from tandem.models.forward import forward_logits
    from tandem.models.registry import shape_from_hf_config
    from tandem.parallel.layout import ParallelConfig, init_distributed

    if not torch.cuda.is_available():
        torch.set_num_threads(1)
    init_distributed(ParallelConfig(ep=world), rank, world, rdzv, seed=1)
    with open(os.path.join(hf_dir, "config.json")) as f:
        shape = shape_from_hf_config(json.load(f))
    model = build_gpt_model(shape, ep=world, params_dtype=DTYPES[dtype_name]).eval()
    load_hf_weights(model, hf_dir, shape, tp_rank=0, tp_size=1)
    ids = tokens().to(next(model.parameters()).device)
    with torch.no_grad():
        logits = forward_logits(model, ids, torch.ones_like(ids)).float().cpu()
    if dtype_name == "fp32":
        export_hf(model, shape, os.path.join(work, "export"), "Qwen3MoeForCausalLM")
    torch.distributed.barrier()
    if rank == 0:
        result = {"logits": logits}
        if dtype_name == "fp32":
            a = load_file(os.path.join(hf_dir, "model.safetensors"))
            b = load_file(os.path.join(work, "export", "model.safetensors"))
            result["round_trip"] = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        torch.save(result, os.path.join(work, "result.pt"))
    torch.distributed.destroy_process_group()


def run(world: int, hf_dir: str, dtype_name: str) -> dict:
    import torch.multiprocessing as mp

    from tandem.parallel.layout import local_tcp_rendezvous

    with tempfile.TemporaryDirectory() as work:
        mp.spawn(rank_main, args=(world, hf_dir, dtype_name, work, local_tcp_rendezvous()), nprocs=world, join=True)
        return torch.load(os.path.join(work, "result.pt"))


def main() -> int:
    gpus = torch.cuda.device_count()
    eps = [1, 2] if TINY or gpus >= 2 else [1]
    device = f"{gpus} x {torch.cuda.get_device_name(0)} (NCCL)" if gpus else "CPU (gloo)"
    print(f"## Qwen3-MoE import vs transformers: {device}, {'tiny' if TINY else 'small'} model\n")
    print(f"config: {CONFIG}; tokens {BATCH} x {SEQ}")
    print(f"tolerances: fp32 max|diff| < {FP32_TOL}; bf16 max|tandem - hf_fp32| <= "
          f"{BF16_FACTOR} x max|hf_bf16 - hf_fp32| + {BF16_SLACK}")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = build_hf(os.path.join(tmp, "hf"))
        truth = hf_logits(hf_dir, torch.float32)
        print(f"max abs(hf fp32 logit) = {truth.abs().max().item():.3g}\n")
        print("| dtype | EP | max abs(tandem - hf same dtype) | max abs(tandem - hf fp32) | max abs(hf - hf fp32) "
              "| round trip | pass |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for dtype_name, dtype in DTYPES.items():
            ref = truth if dtype == torch.float32 else hf_logits(hf_dir, dtype)
            hf_err = (ref - truth).abs().max().item()
            for ep in eps:
                res = run(ep, hf_dir, dtype_name)
                same = (res["logits"] - ref).abs().max().item()
                err = (res["logits"] - truth).abs().max().item()
                rt = res.get("round_trip")
                good = err < FP32_TOL if dtype_name == "fp32" else err <= BF16_FACTOR * hf_err + BF16_SLACK
                good = good and rt is not False
                ok &= good
                print(f"| {dtype_name} | {ep} | {same:.3g} | {err:.3g} | {hf_err:.3g} | "
                      f"{'-' if rt is None else ('bit-exact' if rt else 'DIFFERS')} | {'PASS' if good else 'FAIL'} |",
                      flush=True)
    if 2 not in eps:
        print(f"\nEP=2 skipped: {gpus} GPU(s) visible, 2 needed")
    print(f"\n{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
