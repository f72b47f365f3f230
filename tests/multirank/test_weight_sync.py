"""The TP=1 weight sync (tandem/convert/reshard.py) over 2 gloo ranks: bucketed all-gathers give
bit-identical tensors to the per-parameter path and to the checkpoint itself, for Llama
(untied head), Qwen2 (qkv bias, tied embeddings) and Qwen3-MoE at TP=2, and Qwen3-MoE at EP=2
(every expert under its global index)."""
import os
import sys

from tiny_hf import tiny_llama, tiny_qwen2, tiny_qwen3_moe

from tandem.parallel.layout import local_tcp_rendezvous

HERE = os.path.dirname(os.path.abspath(__file__))


def test_tp1_weights_bucketed_bit_identical(tmp_path, run_ranks):
    dense = [tiny_llama(tmp_path / "llama"), tiny_qwen2(tmp_path / "qwen2")]
    moe = tiny_qwen3_moe(tmp_path / "moe", head_dim=32, norm_topk_prob=True)
    for tp, ep, dirs in ((2, 1, [*dense, moe]), (1, 2, [moe])):
        cmd = [sys.executable, os.path.join(HERE, "..", "helpers", "reshard_rank.py")]
        args = [str(tp), str(ep), local_tcp_rendezvous(), *(str(d) for d in dirs)]
        outs = run_ranks([cmd + [str(r)] + args for r in range(2)], timeout=300)
        assert all(o.count("bit-identical") == len(dirs) for o in outs), outs[0][-2000:]
