"""HF <-> megatron conversion on tiny random Llama / Qwen2 / Qwen3 / Mistral models built locally
(no downloads).

TP=1 in-process (session fixture's 1-rank group); TP=2: tests/multirank/test_hf_convert_tp2.py.
"""
import json
import pathlib

import pytest
import torch
from hf_test_files import copy_with, hf_tensors, import_hf, split_files
from tiny_hf import tiny_llama, tiny_mistral, tiny_qwen2, tiny_qwen3

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROPE = dict(rope_theta=500000.0)  # not the default 10000: a wrong rotary base must show


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {"llama": tiny_llama(root / "llama", **ROPE), "qwen2": tiny_qwen2(root / "qwen2", **ROPE),
            "qwen3": tiny_qwen3(root / "qwen3", **ROPE), "mistral": tiny_mistral(root / "mistral", **ROPE)}


def test_shape_from_hf_config(hf_dirs):
    from transformers import AutoConfig

    from tandem.models.registry import shape_from_hf_config

    q = shape_from_hf_config(AutoConfig.from_pretrained(hf_dirs["qwen2"]))
    assert q.attention_bias and q.tie_word_embeddings and q.rope_theta == 500000.0
    assert (q.num_key_value_heads, q.rms_norm_eps, q.vocab_size) == (2, 1e-5, 128)
    lm = shape_from_hf_config(json.loads((hf_dirs["llama"] / "config.json").read_text()))
    assert not lm.attention_bias and not lm.tie_word_embeddings
    q3 = shape_from_hf_config(json.loads((hf_dirs["qwen3"] / "config.json").read_text()))
    assert q3.qk_layernorm and q3.kv_channels == 32 != q3.hidden_size // q3.num_attention_heads and q3.moe is None
    mi = shape_from_hf_config(json.loads((hf_dirs["mistral"] / "config.json").read_text()))
    assert mi.kv_channels == 8 and not mi.qk_layernorm and not mi.attention_bias


FAMILIES = ["llama", "qwen2", "qwen3", "mistral"]


@pytest.mark.parametrize("family", FAMILIES)
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


@pytest.mark.parametrize("family", FAMILIES)
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


def test_strict_extra_and_missing_keys(megatron_dist, hf_dirs, tmp_path):
    extra = copy_with(hf_dirs["llama"], tmp_path / "extra", add="model.layers.0.mlp.surprise.weight")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.surprise\.weight"):
        import_hf(extra)
    missing = copy_with(hf_dirs["qwen2"], tmp_path / "missing", drop="model.layers.1.self_attn.k_proj.bias")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias"):
        import_hf(missing)


def test_parts_split_across_files_load_in_parallel(megatron_dist, hf_dirs, tmp_path):
    """q/k/v and gate/up parts in different files, read by parallel readers and by one: every
    parameter (NaN before the load) gets the single-file load's exact values."""
    from safetensors import safe_open

    from tandem.convert.hf_load import load_hf_weights
    from tandem.models.build import build_gpt_model

    split = split_files(hf_dirs["qwen2"], tmp_path / "split", 3)
    file_of = {k: p.name for p in split.glob("*.safetensors") for k in safe_open(str(p), "pt").keys()}
    layer = "model.layers.0."
    assert len({file_of[f"{layer}self_attn.{x}_proj.{w}"] for x in "qkv" for w in ("weight", "bias")}) == 3
    assert file_of[f"{layer}mlp.gate_proj.weight"] != file_of[f"{layer}mlp.up_proj.weight"]
    want, shape, _ = import_hf(hf_dirs["qwen2"])
    want = dict(want.named_parameters())
    for readers in (None, 1):
        model = build_gpt_model(shape, weights_follow=True)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        assert load_hf_weights(model, str(split), shape, 0, 1, readers=readers) == set(want)
        for name, p in model.named_parameters():
            assert torch.equal(p, want[name]), (readers, name)


def test_split_checkpoint_refuses_a_key_twice_and_nan(megatron_dist, hf_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    key = "model.layers.1.self_attn.v_proj.weight"
    twice = split_files(hf_dirs["qwen2"], tmp_path / "twice", 3, twice=key)
    with pytest.raises(ValueError, match=rf"HF key '{key}' appears twice in {twice}"):
        import_hf(twice)
    bad = split_files(hf_dirs["qwen2"], tmp_path / "nan", 3)
    second = sorted(bad.glob("*.safetensors"))[1]
    tensors = load_file(str(second))
    key = sorted(tensors)[-1]
    tensors[key].view(-1)[-1] = float("nan")
    save_file(tensors, str(second))
    with pytest.raises(ValueError, match=rf"{second.name}: tensor '{key}' contains NaN or inf"):
        import_hf(bad)


def test_refuses_unsupported_configs(hf_dirs):
    from tandem.models.registry import hf_config_from_shape, shape_from_hf_config

    base = json.loads((hf_dirs["llama"] / "config.json").read_text())
    with pytest.raises(ValueError, match="GemmaForCausalLM.*LlamaForCausalLM"):
        shape_from_hf_config(dict(base, architectures=["GemmaForCausalLM"]))
    with pytest.raises(ValueError, match="sliding_window"):
        shape_from_hf_config(dict(base, architectures=["MistralForCausalLM"], sliding_window=16))
    with pytest.raises(ValueError, match="attention_bias"):
        shape_from_hf_config(dict(base, architectures=["Qwen3ForCausalLM"], attention_bias=True))
    with pytest.raises(ValueError, match="head_dim"):
        shape_from_hf_config(dict(base, head_dim=32))
    with pytest.raises(ValueError, match="rope"):
        shape_from_hf_config(dict(base, rope_scaling={"rope_type": "llama3", "factor": 8.0}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        hf_config_from_shape(shape_from_hf_config(base), "GPT2LMHeadModel")
