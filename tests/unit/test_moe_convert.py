"""HF <-> megatron conversion of a tiny random Qwen3-MoE built locally (no downloads).

EP=1 in-process (session fixture's 1-rank group); EP=2 and TP=2:
tests/multirank/test_hf_convert_tp2.py. Variants: "topk_norm" (norm_topk_prob, head_dim != hidden/heads,
every layer MoE) and "plain" (softmax-then-top-k without renormalising, tied embeddings,
layer 0 a dense MLP via mlp_only_layers).
"""
import json
import pathlib

import pytest
import torch
from hf_test_files import copy_with, hf_tensors, import_hf
from tiny_hf import MOE_VARIANTS as VARIANTS
from tiny_hf import tiny_qwen3_moe

ROOT = pathlib.Path(__file__).resolve().parents[2]
@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {name: tiny_qwen3_moe(root / name, seed=i, **kw) for i, (name, kw) in enumerate(VARIANTS.items())}


def test_shape_from_config(moe_dirs):
    from transformers import AutoConfig

    from tandem.models.registry import shape_from_hf_config

    a = shape_from_hf_config(AutoConfig.from_pretrained(moe_dirs["topk_norm"]))  # v5 spells num_local_experts
    assert (a.kv_channels, a.qk_layernorm, a.attention_bias) == (32, True, False)
    assert (a.moe.num_experts, a.moe.top_k, a.moe.moe_intermediate_size) == (4, 2, 32)
    assert a.moe.norm_topk_prob and a.moe.moe_layers == (0, 1)
    b = shape_from_hf_config(json.loads((moe_dirs["plain"] / "config.json").read_text()))
    assert not b.moe.norm_topk_prob and b.moe.moe_layers == (1,) and b.tie_word_embeddings
    assert b.kv_channels == 16
    raw = json.loads((moe_dirs["plain"] / "config.json").read_text())
    raw = {("num_experts" if k == "num_local_experts" else k): v for k, v in raw.items()}  # Qwen's spelling
    step2 = shape_from_hf_config(dict(raw, mlp_only_layers=[], decoder_sparse_step=2, num_hidden_layers=4))
    assert step2.moe.moe_layers == (1, 3)  # transformers: (i + 1) % step == 0


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_transformers_ep1(megatron_dist, moe_dirs, variant):
    from transformers import AutoModelForCausalLM

    from tandem.models.forward import forward_logits

    model, shape, loaded = import_hf(moe_dirs[variant])
    assert loaded == {n for n, _ in model.named_parameters()}
    hf = AutoModelForCausalLM.from_pretrained(moe_dirs[variant], dtype=torch.float32, attn_implementation="eager")
    ids = torch.randint(0, shape.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        got = forward_logits(model, ids, torch.ones_like(ids))
        want = hf(ids).logits
    assert got.shape == want.shape and want.abs().max() > 0.1
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_round_trip_bit_exact_ep1(megatron_dist, moe_dirs, variant, tmp_path):
    from transformers import AutoConfig

    from tandem.convert.hf_export import export_hf
    from tandem.models.registry import shape_from_hf_config

    model, shape, _ = import_hf(moe_dirs[variant])
    out = export_hf(model, shape, str(tmp_path / "out"), "Qwen3MoeForCausalLM")
    a, b = hf_tensors(moe_dirs[variant]), hf_tensors(out)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert shape_from_hf_config(AutoConfig.from_pretrained(out)) == shape


def test_strict_extra_and_missing_keys(megatron_dist, moe_dirs, tmp_path):
    extra = copy_with(moe_dirs["topk_norm"], tmp_path / "extra", add="model.layers.0.mlp.experts.4.up_proj.weight")
    with pytest.raises(ValueError, match=r"unexpected.*model\.layers\.0\.mlp\.experts\.4\.up_proj\.weight"):
        import_hf(extra)
    missing = copy_with(moe_dirs["topk_norm"], tmp_path / "missing",
                         drop="model.layers.1.mlp.experts.3.down_proj.weight")
    with pytest.raises(ValueError, match=r"missing.*model\.layers\.1\.mlp\.experts\.3\.down_proj\.weight"):
        import_hf(missing)
    no_norm = copy_with(moe_dirs["plain"], tmp_path / "no_norm", drop="model.layers.0.self_attn.k_norm.weight")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.k_norm\.weight"):
        import_hf(no_norm)


def test_refuses_unsupported_configs(moe_dirs):
    from tandem.models.registry import hf_config_from_shape, shape_from_hf_config
    from tandem.models.spec import transformer_config

    base = json.loads((moe_dirs["topk_norm"] / "config.json").read_text())
    for key, value, match in [("attention_bias", True, "attention_bias.*o_proj"),
                              ("use_sliding_window", True, "use_sliding_window"),
                              ("hidden_act", "gelu", "hidden_act"),
                              ("mlp_only_layers", [0, 1], "mlp_only_layers.*no layer has experts"),
                              ("mlp_only_layers", [5], r"mlp_only_layers.*\[5\]"),
                              ("rope_parameters", {"rope_type": "yarn", "factor": 4.0}, "rope")]:
        with pytest.raises(ValueError, match=match):
            shape_from_hf_config(dict(base, **{key: value}))
    shape = shape_from_hf_config(base)
    with pytest.raises(ValueError, match="Qwen2ForCausalLM.*experts"):
        hf_config_from_shape(shape, "Qwen2ForCausalLM")
    with pytest.raises(ValueError, match="num_experts=4 is not divisible by expert_model_parallel_size=3"):
        transformer_config(shape, ep=3)
    with pytest.raises(ValueError, match="num_experts_per_tok=1 with norm_topk_prob"):
        transformer_config(shape_from_hf_config(dict(base, num_experts_per_tok=1)))


def test_parallel_layout_names_expert_parallel():
    from tandem.parallel.layout import ParallelConfig

    ParallelConfig(tp=1, ep=2).validate(world_size=2, num_heads=4, num_query_groups=2, num_experts=4)
    with pytest.raises(ValueError, match="expert_model_parallel_size=2: world size 2 is not divisible by ep x tp x pp"):
        ParallelConfig(tp=2, ep=2).validate(world_size=2, num_heads=4, num_query_groups=2, num_experts=4)
    with pytest.raises(ValueError, match="num_experts=4 is not divisible by expert_model_parallel_size=3"):
        ParallelConfig(ep=3).validate(world_size=3, num_heads=4, num_query_groups=2, num_experts=4)
    with pytest.raises(ValueError, match="expert_model_parallel_size=2 needs a model with experts"):
        ParallelConfig(ep=2).validate(world_size=2, num_heads=4, num_query_groups=2)
