"""HF <-> megatron conversion across ranks (two gloo processes, tests/helpers/hf_rank.py):
logits equal transformers' and the export round trip is bit-exact at TP=2 (Llama, Qwen2, Qwen3,
Mistral) and
at EP=2 and TP=2 (Qwen3-MoE); at PP=2 each stage loads its layers (tests/helpers/hf_pp_rank.py).
The one-rank cases are tests/unit/test_hf_convert.py and test_moe_convert.py."""
import pathlib
import sys

from tiny_hf import MOE_VARIANTS, tiny_llama, tiny_mistral, tiny_qwen2, tiny_qwen3, tiny_qwen3_moe

from tandem.parallel.layout import local_tcp_rendezvous

RANK_SCRIPT = str(pathlib.Path(__file__).resolve().parents[1] / "helpers" / "hf_rank.py")
PP_RANK_SCRIPT = str(pathlib.Path(__file__).resolve().parents[1] / "helpers" / "hf_pp_rank.py")
ROPE = dict(rope_theta=500000.0)


def test_dense_logits_and_round_trip_tp2(tmp_path, run_ranks):
    dirs = [tiny_llama(tmp_path / "llama", **ROPE), tiny_qwen2(tmp_path / "qwen2", **ROPE),
            tiny_qwen3(tmp_path / "qwen3", **ROPE), tiny_mistral(tmp_path / "mistral", **ROPE)]
    args = ["2", "1", local_tcp_rendezvous(), str(tmp_path / "out"), *(str(d) for d in dirs)]
    outs = run_ranks([[sys.executable, RANK_SCRIPT, str(r), *args] for r in range(2)], timeout=240)
    assert outs[0].count("bit-exact") == len(dirs), outs[0][-3000:]


def test_moe_logits_and_round_trip_ep2_and_tp2(tmp_path, run_ranks):
    """EP=2 (each rank holds 2 of the 4 experts, alltoall dispatch over gloo), then TP=2
    (attention and every expert split over 2 ranks), each against transformers."""
    dirs = [tiny_qwen3_moe(tmp_path / name, seed=i, **kw) for i, (name, kw) in enumerate(MOE_VARIANTS.items())]
    for tp, ep in ((1, 2), (2, 1)):
        args = [str(tp), str(ep), local_tcp_rendezvous(), str(tmp_path / f"out{tp}{ep}"),
                *(str(d) for d in dirs)]
        outs = run_ranks([[sys.executable, RANK_SCRIPT, str(r), *args] for r in range(2)], timeout=300)
        assert outs[0].count("bit-exact") == len(dirs), outs[0][-3000:]


def test_dense_import_pp2(tmp_path, run_ranks):
    """Llama (untied output layer) and Qwen2 (tied: the last stage's copy comes from the embedding)."""
    dirs = [tiny_llama(tmp_path / "llama"), tiny_qwen2(tmp_path / "qwen2")]
    args = [local_tcp_rendezvous(), *(str(d) for d in dirs)]
    outs = run_ranks([[sys.executable, PP_RANK_SCRIPT, str(r), *args] for r in range(2)], timeout=240)
    assert all(out.count("the stages equal the whole model") == len(dirs) for out in outs), outs[0][-3000:]
