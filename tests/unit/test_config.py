"""Config errors name the dotted key (and the nearest known keys for a typo)."""
import os
import subprocess
import sys

import pytest

from tandem.config import ConfigError, TandemConfig, load_config, load_config_with_notices, to_yaml


def error_of(*overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, list(overrides))
    return str(e.value)


def test_defaults_load_and_overrides_apply():
    cfg = load_config(None, ["data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
                             "actor_rollout_ref.actor.ppo_mini_batch_size=2", "algorithm.adv_estimator=gae"])
    assert isinstance(cfg, TandemConfig)
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == (4, 2)
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 2 and cfg.algorithm.adv_estimator == "gae"


def test_yaml_round_trip(tmp_path):
    cfg = load_config(None, ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                             "trainer.logger=[jsonl]"])
    path = tmp_path / "c.yaml"
    path.write_text(to_yaml(cfg))
    assert load_config(str(path)) == cfg
    # overrides win over the file
    assert load_config(str(path), ["data.train_batch_size=8"]).data.train_batch_size == 8


def test_unknown_key_names_nearest_keys():
    msg = error_of("actor_rollout_ref.rollout.temprature=0.5")
    assert "unknown config key 'actor_rollout_ref.rollout.temprature'" in msg
    assert "did you mean" in msg and "actor_rollout_ref.rollout.temperature" in msg
    msg = error_of("data.train_batch_sise=4")
    assert "'data.train_batch_sise'" in msg and "data.train_batch_size" in msg


def test_unknown_key_in_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  total_training_step: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert "trainer.total_training_step" in str(e.value) and "trainer.total_training_steps" in str(e.value)


def test_bad_value_names_the_key():
    msg = error_of("data.train_batch_size=abc")
    assert "'data.train_batch_size'" in msg and "abc" in msg
    msg = error_of("actor_rollout_ref.actor.optim.lr=fast")
    assert "'actor_rollout_ref.actor.optim.lr'" in msg
    assert "key=value" in error_of("data.train_batch_size")


@pytest.mark.parametrize("overrides,key,text", [
    (["data.train_batch_size=12", "actor_rollout_ref.actor.ppo_mini_batch_size=5"],
     "actor_rollout_ref.actor.ppo_mini_batch_size", "5 must divide data.train_batch_size=12"),
    (["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n", "grpo"),
    (["actor_rollout_ref.rollout.top_p=1.5"], "actor_rollout_ref.rollout.top_p", "(0, 1]"),
    (["actor_rollout_ref.rollout.temperature=0"], "actor_rollout_ref.rollout.temperature", "> 0"),
    (["actor_rollout_ref.rollout.mode=remote"], "actor_rollout_ref.rollout.mode", "'remote'"),
    (["algorithm.adv_estimator=reinforce"], "algorithm.adv_estimator", "'reinforce'"),
    (["actor_rollout_ref.actor.loss_agg_mode=sum"], "actor_rollout_ref.actor.loss_agg_mode", "'sum'"),
    (["trainer.logger=[neptune]"], "trainer.logger", "neptune"),
    (["actor_rollout_ref.model.max_position_embeddings=32", "data.max_prompt_length=40",
      "data.max_response_length=6"], "actor_rollout_ref.model.max_position_embeddings", "32 < "),
    (["actor_rollout_ref.model.path=/some/hf/dir"], "actor_rollout_ref.model.path", "not a Hugging Face model directory"),
])
def test_validate_errors_name_the_dotted_key(overrides, key, text):
    msg = error_of(*overrides)
    assert msg.startswith(f"{key}:"), msg
    assert text in msg


def test_grpo_n1_is_fine_for_gae():
    cfg = load_config(None, ["actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=gae"])
    assert cfg.actor_rollout_ref.rollout.n == 1


def _tandem(*args):
    return subprocess.run([sys.executable, "-m", "tandem.controller", "run", *args], capture_output=True,
                          text=True, timeout=60)


def test_cli_unknown_key_exits_2_and_names_it():
    r = _tandem("bad.key=1")
    assert r.returncode == 2, r.stderr
    assert "config error" in r.stderr and "unknown config key 'bad" in r.stderr
    r = _tandem("data.bogus_key=1")
    assert r.returncode == 2 and "'data.bogus_key'" in r.stderr, r.stderr
    r = _tandem("data.train_batch_size=12", "actor_rollout_ref.actor.ppo_mini_batch_size=5")
    assert r.returncode == 2 and "actor_rollout_ref.actor.ppo_mini_batch_size" in r.stderr, r.stderr
    assert "run directory" not in r.stdout  # it failed before creating a run or starting services


# ---- remax, TIS, DAPO, validation sampling ----------------------------------------


def test_dapo_tis_and_validation_keys_load_with_verl_names():
    cfg = load_config(None, [
        "algorithm.adv_estimator=remax", "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
        "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_reward",
        "algorithm.filter_groups.max_num_gen_batches=5", "data.gen_batch_size=256",
        "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=2",
        "reward_model.overlong_buffer.penalty_factor=0.5", "actor_rollout_ref.rollout.val_kwargs.n=4",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.temperature=0.7",
        "actor_rollout_ref.rollout.val_kwargs.top_p=0.9", "actor_rollout_ref.rollout.val_kwargs.top_k=5"])
    assert cfg.algorithm.adv_estimator == "remax" and cfg.actor_rollout_ref.actor.tis_imp_ratio_cap == 2.0
    assert cfg.algorithm.filter_groups.max_num_gen_batches == 5 and cfg.data.gen_batch_size == 256
    assert cfg.reward_model.overlong_buffer.len == 2 and cfg.actor_rollout_ref.rollout.val_kwargs.n == 4
    assert load_config("deploy/configs/arithmetic_dapo.yaml").algorithm.filter_groups.enable


def test_every_shipped_config_loads_and_the_7b_one_keeps_its_budget():
    """deploy/configs/*.yaml load as they are; the 7B file's micro-batches stay its token budget
    (not rows), with the CPU optimizer's settings that the memory checks ask for."""
    import glob

    names = sorted(os.path.basename(p) for p in glob.glob("deploy/configs/*.yaml"))
    assert "one_gpu_7b.yaml" in names and "arithmetic_tool.yaml" in names
    for name in names:
        load_config(os.path.join("deploy", "configs", name))
    a = load_config("deploy/configs/one_gpu_7b.yaml").actor_rollout_ref.actor
    assert a.use_dynamic_bsz and a.ppo_max_token_len_per_gpu == 2560 and a.use_kl_loss
    assert a.optim.override_optimizer_config["optimizer_cpu_offload"] and a.megatron.use_distributed_optimizer
    rows = load_config("deploy/configs/one_gpu_7b.yaml", ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
    assert not rows.actor_rollout_ref.actor.use_dynamic_bsz  # a verl script's rows still win


@pytest.mark.parametrize("overrides,key,text", [
    (["algorithm.filter_groups.metric=reward"], "algorithm.filter_groups.metric", "known: ['acc'"),
    (["algorithm.filter_groups.enable=true", "actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=gae"],
     "algorithm.filter_groups.enable", "rollout.n >= 2"),
    (["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=7"],
     "reward_model.overlong_buffer.len", "data.max_response_length=6"),
    (["actor_rollout_ref.rollout.val_kwargs.n=4"], "actor_rollout_ref.rollout.val_kwargs.n", "do_sample"),
    (["actor_rollout_ref.rollout.val_kwargs.do_sample=true"], "actor_rollout_ref.rollout.val_kwargs.temperature",
     "> 0"),
    (["actor_rollout_ref.actor.tis_imp_ratio_cap=0.5"], "actor_rollout_ref.actor.tis_imp_ratio_cap", ">= 1"),
    (["data.gen_batch_size=0"], "data.gen_batch_size", ">= 1"),
    (["algorithm.adv_estimator=remix"], "algorithm.adv_estimator", "'remax'"),
])
def test_dapo_tis_and_validation_bad_values_name_the_key(overrides, key, text):
    msg = error_of(*overrides)
    assert msg.startswith(key) and text in msg, msg


def test_dapo_tis_and_validation_typos_name_nearest_keys():
    msg = error_of("algorithm.filter_groups.enabled=true")
    assert "algorithm.filter_groups.enable" in msg and "did you mean" in msg
    msg = error_of("actor_rollout_ref.rollout.val_kwargs.do_sampling=true")
    assert "actor_rollout_ref.rollout.val_kwargs.do_sample" in msg
    msg = error_of("actor_rollout_ref.actor.tis_imp_ratio=2")
    assert "actor_rollout_ref.actor.tis_imp_ratio_cap" in msg


def test_parallel_layout_errors_name_the_numbers():
    from tandem.config import ConfigError, load_config

    cases = [
        (["services.actor.world_size=3", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"],
         ["services.actor.world_size", "3", "2 x 1"]),
        (["services.actor.world_size=3", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3"],
         ["tensor_model_parallel_size", "num_attention_heads=4", "num_key_value_heads=2"]),
        (["critic.megatron.tensor_model_parallel_size=0"], ["critic.megatron.tensor_model_parallel_size", ">= 1"]),
        (["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", "services.actor.world_size=2"],
         ["actor_rollout_ref.rollout.tensor_model_parallel_size", "pipeline_model_parallel_size=2",
          "set 1", "standalone"]),
        (["actor_rollout_ref.actor.megatron.dtype=float8"], ["actor_rollout_ref.actor.megatron.dtype", "float8"]),
        (["trainer.resume_mode=sometimes"], ["trainer.resume_mode", "auto"]),
        (["trainer.resume_mode=resume_path"], ["trainer.resume_from_path"]),
    ]
    for overrides, fragments in cases:
        with pytest.raises(ConfigError) as e:
            load_config(None, overrides)
        for frag in fragments:
            assert frag in str(e.value), (overrides, str(e.value))


def test_mini_batch_must_cover_the_data_parallel_ranks():
    from tandem.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(None, ["services.actor.world_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
                           "actor_rollout_ref.rollout.n=2", "data.train_batch_size=4"])
    assert "actor_rollout_ref.actor.ppo_mini_batch_size" in str(e.value) and "4 data-parallel" in str(e.value)


def _moe_dir(tmp_path, **extra):
    """A Qwen3-MoE config.json, a placeholder weights file and the built-in tokenizer (validation
    reads config.json and the tokenizer, and only looks for the weights file)."""
    import json
    import shutil

    from tandem.tasks.arithmetic import build_tokenizer

    (tmp_path / "config.json").write_text(json.dumps(dict(
        architectures=["Qwen3MoeForCausalLM"], num_attention_heads=4, num_key_value_heads=2, num_experts=4,
        vocab_size=128, hidden_size=64, num_hidden_layers=2, intermediate_size=96, moe_intermediate_size=32,
        num_experts_per_tok=2, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000, **extra)))
    (tmp_path / "model.safetensors").write_bytes(b"")
    tok = build_tokenizer(str(tmp_path.parent / f"{tmp_path.name}-tokenizer"))
    for name in os.listdir(tok):
        shutil.copy(os.path.join(tok, name), tmp_path / name)
    return str(tmp_path)


def test_expert_parallel_loads_and_bad_values_name_the_numbers(tmp_path):
    moe = _moe_dir(tmp_path)
    ep2 = [f"actor_rollout_ref.model.path={moe}", "actor_rollout_ref.rollout.mode=standalone",
           "services.actor.world_size=2", "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
           "critic.megatron.expert_model_parallel_size=1"]
    cfg = load_config(None, ep2)
    assert cfg.actor_rollout_ref.actor.megatron.expert_model_parallel_size == 2
    cases = [
        (ep2 + ["actor_rollout_ref.actor.megatron.expert_model_parallel_size=3", "services.actor.world_size=3"],
         ["actor_rollout_ref.actor.megatron.expert_model_parallel_size", "3 must divide num_experts=4"]),
        (ep2 + ["services.actor.world_size=3"], ["services.actor.world_size", "3 is not a multiple", "1 x 1 x 2"]),
        (ep2 + ["actor_rollout_ref.actor.megatron.expert_model_parallel_size=0"],
         ["expert_model_parallel_size", ">= 1"]),
        (ep2[1:], ["actor_rollout_ref.actor.megatron.expert_model_parallel_size", "mixture-of-experts", "dense"]),
        (ep2 + ["actor_rollout_ref.rollout.mode=colocated"], ["actor_rollout_ref.rollout.mode", "standalone"]),
        (ep2 + ["services.actor.world_size=4", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                "actor_rollout_ref.actor.megatron.sequence_parallel=false"],
         ["actor_rollout_ref.actor.megatron.sequence_parallel", "tensor_model_parallel_size=2"]),
        (ep2 + ["services.actor.world_size=4", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1"],
         ["actor_rollout_ref.actor.megatron.expert_tensor_parallel_size", "1: Tandem splits experts", "set 2"]),
        (ep2 + ["actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.rollout.n=3",
                "data.train_batch_size=4"],
         ["actor_rollout_ref.actor.ppo_mini_batch_size", "3 rows must split evenly over 2"]),
        ([f"actor_rollout_ref.model.path={moe}", "critic.megatron.expert_model_parallel_size=2",
          "services.critic.world_size=2"], []),  # the critic: fine (standalone applies to the actor only)
        (["critic.megatron.expert_model_parallel_size=2", "services.critic.world_size=2"],
         ["critic.megatron.expert_model_parallel_size", "dense"]),
    ]
    for overrides, fragments in cases:
        if not fragments:
            load_config(None, overrides)
            continue
        msg = error_of(*overrides)
        for frag in fragments:
            assert frag in msg, (overrides, msg)


def test_router_load_balancing_overrides(tmp_path):
    moe = _moe_dir(tmp_path)
    key = "actor_rollout_ref.actor.megatron.override_transformer_config"
    cfg = load_config(None, [f"actor_rollout_ref.model.path={moe}", f"{key}.moe_aux_loss_coeff=0.01",
                             f"{key}.moe_router_load_balancing_type=aux_loss"])
    assert cfg.actor_rollout_ref.actor.megatron.override_transformer_config == {
        "moe_aux_loss_coeff": 0.01, "moe_router_load_balancing_type": "aux_loss"}
    for override, fragments in [
        (f"{key}.moe_router_load_balancing_type=sinkhorn", [f"{key}.moe_router_load_balancing_type", "sinkhorn"]),
        (f"{key}.moe_aux_loss_coeff=-1", [f"{key}.moe_aux_loss_coeff", "-1", ">= 0"]),
        (f"{key}.moe_aux_loss_coeff=lots", [f"{key}.moe_aux_loss_coeff", "lots"]),
        (f"{key}.num_layers=3", [key, "num_layers", "moe_aux_loss_coeff"]),
    ]:
        msg = error_of(f"actor_rollout_ref.model.path={moe}", override)
        for frag in fragments:
            assert frag in msg, (override, msg)
    assert "mixture-of-experts" in error_of(f"{key}.moe_aux_loss_coeff=0.1")  # the built-in model is dense
    assert "critic.megatron.override_transformer_config" in error_of("critic.megatron.override_transformer_config.x=1")


def test_generation_tp_values():
    tp2 = ["services.actor.world_size=2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"]
    for value in ("1", "2", "null"):  # a TP=1 copy per rank, or the actor's own modules
        load_config(None, tp2 + [f"actor_rollout_ref.rollout.tensor_model_parallel_size={value}"])
    pp2 = ["services.actor.world_size=2", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"]
    load_config(None, pp2 + ["actor_rollout_ref.rollout.tensor_model_parallel_size=1"])  # runs generate on copies
    load_config(None, pp2 + ["actor_rollout_ref.rollout.mode=standalone"])
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    cfg, taken = load_config_with_notices(None, [*tp2, f"{key}=4"])  # verl's engine TP: the actor's here
    assert getattr(cfg.actor_rollout_ref.rollout, "tensor_model_parallel_size") is None
    assert any(n.startswith(f"verl key {key}=4 -> a colocated rollout generates at the actor's TP")
               for n in taken.notices), taken.notices
    # a standalone rollout runs at its own TP: its world size a multiple of it, heads divisible
    standalone = ["actor_rollout_ref.rollout.mode=standalone", "services.rollout.world_size=4"]
    for tp in ("1", "2"):
        load_config(None, standalone + [f"{key}={tp}"])
    assert "services.rollout.world_size" in error_of(*standalone, "services.rollout.world_size=3", f"{key}=2")
    msg = error_of(*standalone, f"{key}=3", "services.rollout.world_size=3")
    assert key in msg and "num_attention_heads=4" in msg, msg


@pytest.mark.parametrize("overrides,fragments", [
    (["actor_rollout_ref.rollout.weight_sync.transport=carrier_pigeon"],
     ["actor_rollout_ref.rollout.weight_sync.transport", "'carrier_pigeon'", "nccl", "stream"]),
    (["actor_rollout_ref.rollout.weight_sync.chunk_mb=0"], ["actor_rollout_ref.rollout.weight_sync.chunk_mb", "(0, 256]"]),
    (["actor_rollout_ref.rollout.weight_sync.chunk_mb=300"], ["weight_sync.chunk_mb"]),
    (["actor_rollout_ref.rollout.weight_sync.bucket_mb=0"], ["actor_rollout_ref.rollout.weight_sync.bucket_mb"]),
    (["actor_rollout_ref.rollout.weight_sync.timeout_s=0"], ["actor_rollout_ref.rollout.weight_sync.timeout_s"]),
    (["services.rollout.replicas=0"], ["services.rollout.replicas", "1..64"]),
    (["services.rollout.replicas=2", "services.rollout.endpoint=h:1"], ["services.rollout.endpoint", "1 endpoints"]),
    (["services.rollout.devices=a,b"], ["services.rollout.devices", "GPU indices"]),
    (["services.rollout.replicas=2", "services.rollout.devices=1,2,3"], ["services.rollout.devices", "3 GPUs"]),
    (["services.actor.gpu_memory_fraction=1.5"], ["services.actor.gpu_memory_fraction", "(0, 1]"]),
])
def test_weight_sync_and_replica_keys(overrides, fragments):
    msg = error_of("actor_rollout_ref.rollout.mode=standalone", *overrides)
    assert all(f in msg for f in fragments), msg


def test_weight_sync_and_replica_values_load():
    cfg = load_config(None, ["actor_rollout_ref.rollout.mode=standalone", "services.rollout.replicas=2",
                             "actor_rollout_ref.rollout.weight_sync.transport=nccl", "services.rollout.devices=1,2",
                             "actor_rollout_ref.rollout.weight_sync.chunk_mb=0.5", "services.actor.gpu_memory_fraction=0.4"])
    assert cfg.services.rollout.replicas == 2 and cfg.actor_rollout_ref.rollout.weight_sync.chunk_mb == 0.5
    msg = error_of("services.rollout.replicas=2")  # colocated: the actor serves the rollout itself
    assert "services.rollout.replicas" in msg and "standalone" in msg
    assert "services.critic.replicas" in error_of("services.critic.replicas=2")


def test_an_architecture_tandem_cannot_load_is_a_config_error(tmp_path):
    """Named at load, before any service starts (the model-family registry reads config.json)."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 64}))
    msg = error_of(f"actor_rollout_ref.model.path={tmp_path}")
    line = next(line for line in msg.splitlines() if "GPT2LMHeadModel" in line)
    assert line.lstrip("- ").startswith("actor_rollout_ref.model.path:"), msg
    assert "LlamaForCausalLM" in msg  # the known architectures are listed
