"""The model-family registry (tandem/models/registry.py): a family registered from outside the
package is served like a built-in one; duplicates and unknown architectures raise."""
import pytest

from tandem.models import registry
from tandem.models.families import _common
from tandem.models.spec import ModelShape

LLAMA_CONFIG = dict(architectures=["LlamaForCausalLM"], vocab_size=128, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                    max_position_embeddings=64, rope_theta=10000.0, rms_norm_eps=1e-5)


@pytest.fixture
def scratch_registry(monkeypatch):
    """The built-in families in a copy that the test may add to (restored afterwards)."""
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._families()))


def mistral_family() -> registry.Family:
    """A toy Mistral under a name of its own (the built-in one is families/mistral.py): Llama's
    weight table; its own config rules (no sliding window, no biases)."""

    def shape_from_config(c: dict) -> ModelShape:
        if c.get("sliding_window") is not None:
            registry.refuse("sliding_window", c["sliding_window"], "sliding-window attention is not supported")
        return _common.dense_shape(c, attention_bias=False)

    def check_shape(shape: ModelShape) -> None:
        _common.check_dense_shape(shape, "ToyMistralForCausalLM")
        if shape.attention_bias:
            registry.refuse("attention_bias", True, "Mistral has no biases")

    def config_from_shape(shape: ModelShape, dtype: str) -> dict:
        return dict(_common.base_config(shape, "ToyMistralForCausalLM", "mistral", dtype), sliding_window=None)

    return registry.Family("ToyMistralForCausalLM", shape_from_config, check_shape, config_from_shape,
                           _common.dense_mappings)


def test_built_in_families():
    assert registry.architectures() == ["LlamaForCausalLM", "LlamaForSequenceClassification", "MistralForCausalLM",
                                        "Qwen2ForCausalLM", "Qwen2ForSequenceClassification", "Qwen3ForCausalLM",
                                        "Qwen3MoeForCausalLM"]
    dense = registry.shape_from_hf_config(LLAMA_CONFIG)
    assert registry.default_architecture(dense) == "LlamaForCausalLM"
    qwen2 = registry.shape_from_hf_config(dict(LLAMA_CONFIG, architectures=["Qwen2ForCausalLM"]))
    assert qwen2.attention_bias and registry.default_architecture(qwen2) == "Qwen2ForCausalLM"


def test_a_family_registered_outside_the_package_is_served(scratch_registry):
    registry.register(mistral_family())
    assert "ToyMistralForCausalLM" in registry.architectures()
    config = dict(LLAMA_CONFIG, architectures=["ToyMistralForCausalLM"], sliding_window=None)
    shape = registry.shape_from_hf_config(config)
    assert shape == registry.shape_from_hf_config(LLAMA_CONFIG)
    with pytest.raises(ValueError, match=r"sliding_window=4096 .*known architectures: \[.*'ToyMistralForCausalLM'"):
        registry.shape_from_hf_config(dict(config, sliding_window=4096))
    table = registry.weight_mappings(shape, architecture="ToyMistralForCausalLM")
    assert table == registry.weight_mappings(shape, architecture="LlamaForCausalLM")
    assert len(table) == 2 + 6 * shape.num_hidden_layers + 1  # embedding, final norm; 6 per layer; head
    back = registry.hf_config_from_shape(shape, "ToyMistralForCausalLM", dtype="bfloat16")
    assert (back["architectures"], back["model_type"], back["dtype"]) == (["ToyMistralForCausalLM"], "mistral", "bfloat16")
    assert registry.shape_from_hf_config(back) == shape
    with pytest.raises(ValueError, match="attention_bias=True"):
        registry.hf_config_from_shape(ModelShape(attention_bias=True), "ToyMistralForCausalLM")


def test_duplicate_registration_raises(scratch_registry):
    registry.register(mistral_family())
    with pytest.raises(ValueError, match="'ToyMistralForCausalLM' is registered twice"):
        registry.register(mistral_family())
    llama = registry.family("LlamaForCausalLM")
    with pytest.raises(ValueError, match="'LlamaForCausalLM' is registered twice"):
        registry.register(llama)


def test_unknown_architecture_names_the_known_ones():
    known = (r"known architectures: \['LlamaForCausalLM', 'LlamaForSequenceClassification', 'MistralForCausalLM', "
             r"'Qwen2ForCausalLM', 'Qwen2ForSequenceClassification', 'Qwen3ForCausalLM', 'Qwen3MoeForCausalLM'\]")
    with pytest.raises(ValueError, match=r"architectures=\['GPT2LMHeadModel'\] \(exactly one known architecture "
                                         r"expected\); " + known):
        registry.shape_from_hf_config(dict(LLAMA_CONFIG, architectures=["GPT2LMHeadModel"]))
    with pytest.raises(ValueError, match=r"architecture='GPT2LMHeadModel' \(cannot export\); " + known):
        registry.hf_config_from_shape(ModelShape(), "GPT2LMHeadModel")
    with pytest.raises(ValueError, match=r"architecture='GPT2LMHeadModel' \(unknown architecture\); " + known):
        registry.weight_mappings(ModelShape(), architecture="GPT2LMHeadModel")


def test_sequence_classification_families_are_the_causal_table_with_a_score_head():
    """A reward model's table: the causal LM's minus lm_head, plus score.weight on the scalar head;
    one label only, and never an export target."""
    for causal, seq_cls in (("LlamaForCausalLM", "LlamaForSequenceClassification"),
                            ("Qwen2ForCausalLM", "Qwen2ForSequenceClassification")):
        config = dict(LLAMA_CONFIG, architectures=[seq_cls], id2label={"0": "LABEL_0"})
        shape = registry.shape_from_hf_config(config)
        assert shape == registry.shape_from_hf_config(dict(config, architectures=[causal]))
        assert registry.family(seq_cls).head == "scalar" and registry.family(causal).head == "lm"
        lm = {(m.megatron, m.hf_names) for m in registry.weight_mappings(shape, architecture=causal)}
        rm = {(m.megatron, m.hf_names) for m in registry.weight_mappings(shape, architecture=seq_cls)}
        assert lm - rm == {("output_layer.weight", ("lm_head.weight",))}
        assert rm - lm == {("output_layer.weight", ("score.weight",))}
        with pytest.raises(ValueError, match=r"num_labels=2 \(a reward model has one label"):
            registry.shape_from_hf_config(dict(config, id2label={"0": "A", "1": "B"}))
        with pytest.raises(ValueError, match="loaded, not exported"):
            registry.hf_config_from_shape(shape, seq_cls)
        assert registry.default_architecture(shape) == causal
