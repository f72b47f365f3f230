"""megatron.override_transformer_config (tandem/config/transformer_overrides.py): the fields that apply to
Tandem's layer spec reach megatron-core's TransformerConfig (activation recomputation runs on CPU and changes
no number), the ones that need kernel libraries are refused naming why, other fields are refused."""
import pytest
import torch

from tandem.config import ConfigError, load_config

KEY = "actor_rollout_ref.actor.megatron.override_transformer_config"


def test_passed_read_and_refused_fields():
    cfg = load_config(None, [f"+{KEY}.recompute_granularity=full", f"+{KEY}.recompute_method=uniform",
                             f"+{KEY}.recompute_num_layers=1", f"+{KEY}.moe_router_dtype=fp32",
                             f"+{KEY}.apply_rope_fusion=False", f"{KEY}.attention_backend=fused"])
    assert cfg.actor_rollout_ref.actor.megatron.override_transformer_config == {
        "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
        "moe_router_dtype": "fp32", "apply_rope_fusion": False}  # attention_backend: a notice, nothing set
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"+{KEY}.recompute_granularity=some", f"+{KEY}.gradient_accumulation_fusion=True",
                           f"+{KEY}.moe_token_dispatcher_type=flex", f"+{KEY}.num_layers=3",
                           f"+{KEY}.num_layers_in_last_pipeline_stage=2"])
    msg = str(e.value)
    for fragment in (f"{KEY}.recompute_granularity: 'some'; accepted: null, full or selective",
                     f"{KEY}.gradient_accumulation_fusion: True: needs fused kernels from Transformer Engine or Apex",
                     f"{KEY}.moe_token_dispatcher_type: 'flex': Tandem's dispatcher is alltoall",
                     f"{KEY}.num_layers: not passed to megatron-core by Tandem",
                     f"{KEY}.num_layers_in_last_pipeline_stage: 2: uneven pipeline stages are not offered"):
        assert fragment in msg, (fragment, msg)


@pytest.mark.parametrize("overrides", [
    {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
    {"recompute_granularity": "selective", "recompute_modules": ["core_attn", "mlp"]},
])
def test_recomputation_reaches_megatron_and_changes_no_number(megatron_dist, overrides):
    from tandem.models.build import build_gpt_model
    from tandem.models.forward import forward_logits
    from tandem.models.spec import ModelShape

    shape = ModelShape(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=64, max_position_embeddings=16)
    ids, mask = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0)), torch.ones(2, 8)

    def run(over):
        torch.manual_seed(0)
        model = build_gpt_model(shape, overrides=over).train()
        logits = forward_logits(model, ids, mask)
        logits.float().square().mean().backward()
        return model, logits.detach(), [p.grad.clone() for p in model.parameters()]

    model, logits, grads = run(overrides)
    assert all(getattr(model.config, k) == v for k, v in overrides.items())
    _, ref_logits, ref_grads = run(None)
    torch.testing.assert_close(logits, ref_logits)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)
