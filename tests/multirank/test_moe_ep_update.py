"""A Qwen3-MoE trained at expert parallel 2 (2 gloo ranks: DP=2 for dense weights, each rank
2 of the 4 experts) takes the same optimizer step as at EP=1: megatron's DDP reduces dense
gradients over DP and leaves expert gradients to their one owner."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def _tiny_qwen3_moe(path):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, max_position_embeddings=64, initializer_range=0.1))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 1.0)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def test_update_at_ep2_equals_ep1(tmp_path, run_ranks):
    from safetensors.torch import load_file

    hf = _tiny_qwen3_moe(tmp_path / "hf")
    out, logs = {}, {}
    for world in (1, 2):
        cmd = [sys.executable, os.path.join(HERE, "moe_update_rank.py")]
        args = [str(world), str(tmp_path / f"rdzv{world}"), str(tmp_path / f"out{world}"), str(hf)]
        logs[world] = run_ranks([cmd + [str(r)] + args for r in range(world)], timeout=300)[0]
        out[world] = load_file(str(tmp_path / f"out{world}" / "model.safetensors"))
    before = load_file(str(hf / "model.safetensors"))
    assert out[1].keys() == out[2].keys() == before.keys()
    for k in before:
        torch.testing.assert_close(out[2][k], out[1][k], atol=1e-5, rtol=0, msg=k)
    # every expert and router moved (Adam's first step is ~lr on every weight with a gradient)
    for k in before:
        if ".mlp." in k:
            assert (out[1][k] - before[k]).abs().max() > 5e-4, k
    norms = [float(logs[w].split("grad_norm=")[1].split()[0]) for w in (1, 2)]
    assert abs(norms[0] - norms[1]) < 1e-4 * norms[0], norms
