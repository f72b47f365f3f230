"""Config errors name the dotted key (and the nearest known keys for a typo)."""
import subprocess
import sys

import pytest

from tandem.config import ConfigError, TandemConfig, load_config, to_yaml


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
    (["trainer.logger=[wandb]"], "trainer.logger", "wandb"),
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
    return subprocess.run([sys.executable, "-m", "controller", "run", *args], capture_output=True,
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
