"""The memory keys: verl's offload keys load everywhere verl has them, and the CPU optimizer
offload override is refused, naming the key, wherever megatron-core could not run it."""
import pytest

from tandem.config import ConfigError, load_config

A = "actor_rollout_ref.actor"
OVER = f"{A}.optim.override_optimizer_config"
CPU_ADAM = [f"{A}.megatron.dtype=bfloat16", f"{A}.megatron.use_distributed_optimizer=true",
            f"{OVER}.optimizer_cpu_offload=true", f"{OVER}.optimizer_offload_fraction=0.5",
            f"{OVER}.use_precision_aware_optimizer=true", f"{OVER}.overlap_cpu_optimizer_d2h_h2d=true"]


def error_of(*overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, list(overrides))
    return str(e.value)


def test_verl_offload_keys_load_for_actor_reference_and_critic():
    keys = [f"{section}.megatron.{k}_offload=true" for section in (A, "critic") for k in ("param", "grad", "optimizer")]
    cfg = load_config(None, keys + ["actor_rollout_ref.ref.megatron.param_offload=true"])
    for m in (cfg.actor_rollout_ref.actor.megatron, cfg.critic.megatron):
        assert m.param_offload and m.grad_offload and m.optimizer_offload
    assert cfg.actor_rollout_ref.ref.megatron.param_offload
    assert not load_config(None, []).actor_rollout_ref.ref.megatron.param_offload  # off by default
    assert "actor_rollout_ref.ref.megatron.grad_offload" in error_of("actor_rollout_ref.ref.megatron.grad_offload=true")
    msg = error_of("reward_model.megatron.param_offload=true")  # verl's key; the reward model is not offloaded
    assert msg.startswith("reward_model.megatron.param_offload:") and "set false" in msg, msg


def test_cpu_optimizer_offload_loads_with_what_megatron_needs():
    cfg = load_config(None, CPU_ADAM)
    assert cfg.actor_rollout_ref.actor.optim.override_optimizer_config["optimizer_offload_fraction"] == 0.5
    critic = [k.replace(A, "critic") for k in CPU_ADAM]
    assert load_config(None, critic).critic.optim.override_optimizer_config["optimizer_cpu_offload"] is True


@pytest.mark.parametrize("change, key, words", [
    (f"{A}.megatron.dtype=float32", f"{A}.megatron.dtype", "set bfloat16"),
    (f"{A}.megatron.use_distributed_optimizer=false", f"{A}.megatron.use_distributed_optimizer", "must be true"),
    (f"{OVER}.use_precision_aware_optimizer=false", f"{OVER}.use_precision_aware_optimizer", "must be true"),
    (f"{OVER}.optimizer_offload_fraction=0", f"{OVER}.optimizer_offload_fraction", "in (0, 1]"),
    (f"{OVER}.optimizer_offload_fraction=1.5", f"{OVER}.optimizer_offload_fraction", "in [0, 1]"),
    (f"{OVER}.optimizer_cpu_offload=2", f"{OVER}.optimizer_cpu_offload", "true or false"),
    (f"{OVER}.adam_eps=1e-6", OVER, "unknown keys ['adam_eps']"),
])
def test_cpu_optimizer_offload_misuse_names_the_key(change, key, words):
    msg = error_of(*CPU_ADAM, change)
    assert msg.startswith(f"{key}:") and words in msg, msg


@pytest.mark.parametrize("extra, key", [
    (f"{OVER}.use_precision_aware_optimizer=true", f"{OVER}.use_precision_aware_optimizer"),
    (f"{OVER}.optimizer_offload_fraction=0.5", f"{OVER}.optimizer_offload_fraction"),
    (f"{OVER}.overlap_cpu_optimizer_d2h_h2d=true", f"{OVER}.overlap_cpu_optimizer_d2h_h2d"),
    ("critic.optim.override_optimizer_config.optimizer_offload_fraction=1",
     "critic.optim.override_optimizer_config.optimizer_offload_fraction"),
])
def test_settings_without_the_cpu_offload_they_belong_to_are_refused(extra, key):
    msg = error_of(extra)
    assert msg.startswith(f"{key}:") and "optimizer_cpu_offload" in msg, msg


def test_the_cpu_optimizer_offload_needs_cuda_at_build_time(megatron_dist):
    """The config cannot know where the service runs; the optimizer refuses on a CPU host."""
    import torch

    from tandem.config import OptimConfig
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape
    from tandem.parallel import device
    from tandem.train.optim import Optimizer, wrap_ddp

    if device.has_cuda():
        pytest.skip("a CUDA host runs it")
    model = build_gpt_model(ModelShape(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1, intermediate_size=32, max_position_embeddings=16),
                            params_dtype=torch.float32)
    with pytest.raises(ValueError, match="optimizer_cpu_offload: .* needs CUDA"):
        Optimizer(wrap_ddp(model), OptimConfig(override_optimizer_config={"optimizer_cpu_offload": True}))
