"""HF <-> megatron conversion on tiny random Llama / Qwen2 models built locally (no downloads).

TP=1 in-process (session fixture's 1-rank group); TP=2 in two worker processes over gloo.
"""
import json
import pathlib
import sys

import pytest
import torch
from hf_test_files import copy_with, hf_tensors, import_hf

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, intermediate_size=128, max_position_embeddings=64,
            rope_theta=500000.0, rms_norm_eps=1e-5, initializer_range=0.1)


def _tiny_hf(family: str, path: pathlib.Path) -> pathlib.Path:
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(0 if family == "llama" else 1)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False))
    else:  # Qwen2-0.5B style: qkv bias, tied embeddings
        model = Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=True))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)  # nonzero: a wrong bias layout must show in the logits
            elif "norm" in name:
                p.uniform_(0.5, 1.5)  # non-unit norms: a swapped norm must show too
    model.save_pretrained(str(path), safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {f: _tiny_hf(f, root / f) for f in ("llama", "qwen2")}


def test_shape_from_hf_config(hf_dirs):
    from transformers import AutoConfig

    from tandem.models.registry import shape_from_hf_config

    q = shape_from_hf_config(AutoConfig.from_pretrained(hf_dirs["qwen2"]))
    assert q.attention_bias and q.tie_word_embeddings and q.rope_theta == 500000.0
    assert (q.num_key_value_heads, q.rms_norm_eps, q.vocab_size) == (2, 1e-5, 128)
    lm = shape_from_hf_config(json.loads((hf_dirs["llama"] / "config.json").read_text()))
    assert not lm.attention_bias and not lm.tie_word_embeddings


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_logits_match_transformers_tp1(megatron_dist, hf_dirs, family):
    from transformers import AutoModelForCausalLM

    from tandem.models.forward import forward_logits

    model, shape, loaded = import_hf(hf_dirs[family])
    assert loaded == {n for n, _ in model.named_parameters()}
    hf = AutoModelForCausalLM.from_pretrained(hf_dirs[family], dtype=torch.float32,
                                              attn_implementation="eager")
    ids = torch.randint(0, shape.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        got = forward_logits(model, ids, torch.ones_like(ids))
        want = hf(ids).logits
    assert got.shape == want.shape
    assert want.abs().max() > 0.1  # logits are not trivially ~0
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_round_trip_bit_exact_tp1(megatron_dist, hf_dirs, family, tmp_path):
    from tandem.convert.hf_export import export_hf

    model, shape, _ = import_hf(hf_dirs[family])
    arch = json.loads((hf_dirs[family] / "config.json").read_text())["architectures"][0]
    out = export_hf(model, shape, str(tmp_path / "out"), arch)
    a, b = hf_tensors(hf_dirs[family]), hf_tensors(out)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    # the exported config loads back as the same shape, and transformers reads it
    from transformers import AutoConfig

    from tandem.models.registry import shape_from_hf_config

    assert shape_from_hf_config(AutoConfig.from_pretrained(out)) == shape


def test_logits_and_round_trip_tp2(hf_dirs, tmp_path, run_ranks):
    cmd = [sys.executable, str(ROOT / "tests/unit/hf_rank_worker.py")]
    args = ["2", "1", str(tmp_path / "init"), str(tmp_path / "out"), str(hf_dirs["llama"]), str(hf_dirs["qwen2"])]
    outs = run_ranks([cmd + [str(r)] + args for r in range(2)], timeout=120)
    assert outs[0].count("bit-exact") == 2, outs[0][-3000:]


def test_strict_extra_and_missing_keys(megatron_dist, hf_dirs, tmp_path):
    extra = copy_with(hf_dirs["llama"], tmp_path / "extra", add="model.layers.0.mlp.surprise.weight")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.surprise\.weight"):
        import_hf(extra)
    missing = copy_with(hf_dirs["qwen2"], tmp_path / "missing", drop="model.layers.1.self_attn.k_proj.bias")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias"):
        import_hf(missing)


def test_refuses_unsupported_configs(hf_dirs):
    from tandem.models.registry import hf_config_from_shape, shape_from_hf_config

    base = json.loads((hf_dirs["llama"] / "config.json").read_text())
    with pytest.raises(ValueError, match="MistralForCausalLM.*LlamaForCausalLM"):
        shape_from_hf_config(dict(base, architectures=["MistralForCausalLM"]))
    with pytest.raises(ValueError, match="head_dim"):
        shape_from_hf_config(dict(base, head_dim=32))
    with pytest.raises(ValueError, match="rope"):
        shape_from_hf_config(dict(base, rope_scaling={"rope_type": "llama3", "factor": 8.0}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        hf_config_from_shape(shape_from_hf_config(base), "GPT2LMHeadModel")
