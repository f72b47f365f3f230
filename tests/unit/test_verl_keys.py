"""verl's config keys in Tandem (tandem/config/verl_keys.py, verl_compat.py): every key of verl's
Megatron trainer config is honoured, mapped or refused with a reason; verl's own example loads; all
problems of a config come in one error; unknown keys get hints from Tandem's and verl's names."""
import pathlib

import pytest
from omegaconf import OmegaConf

from tandem.config import ConfigError, load_config, load_config_with_notices
from tandem.config.schema import TandemConfig
from tandem.config.verl_compat import UNKNOWN, TandemKeys, translate, verl_defaults
from tandem.config.verl_keys import HONOURED, MAPPED, REFUSED, RULES

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "data" / "verl_run_qwen2-7b_math_megatron.txt"
KEYS = TandemKeys.of(OmegaConf.structured(TandemConfig))


def taken(**user):
    return translate({k.replace("__", "."): v for k, v in user.items()}, KEYS)


def kinds(translation) -> dict[str, int]:
    out = {HONOURED: 0, MAPPED: 0, REFUSED: 0, UNKNOWN: 0}
    for o in translation.outcomes:
        out[o.kind] += 1
    return out


def example(home="/home/u", model="/models/qwen2"):
    lines = [x.strip() for x in EXAMPLE.read_text().splitlines() if x.strip() and not x.startswith("#")]
    return [x.replace("{HOME}", home).replace("{MODEL}", model) for x in lines]


def test_every_verl_key_at_its_default_is_honoured_or_mapped():
    defaults = verl_defaults()
    assert len(defaults) > 600 and "actor_rollout_ref.actor.megatron.param_offload" in defaults
    t = translate(dict(defaults), KEYS)
    assert not t.problems, t.problems[:5]  # no key unknown, no default refused
    assert kinds(t)[HONOURED] > 300 and kinds(t)[MAPPED] > 100
    # a mapped key at verl's default gets a notice only when it sets a Tandem key (verl's rollout TP=2, its
    # vLLM engine's, becomes the actor's TP)
    assert len(t.notices) == len([o for o in t.of_kind(MAPPED) if o.updates]) == 5, t.notices
    assert t.tandem["actor_rollout_ref.rollout.tensor_model_parallel_size"] is None


def test_every_rule_is_reached_by_a_verl_key_and_tandem_keys_are_never_shadowed():
    import fnmatch

    keys = list(verl_defaults())
    # keys inside verl's dicts, and keys of verl's recipes (DAPO's reward manager, the fully-async trainer)
    elsewhere = ("actor_rollout_ref.ref.megatron.override_transformer_config*", "reward_model.reward_kwargs.*",
                 "*.model.override_config.model_config.max_position_embeddings", "async_training.staleness_threshold")
    for rule in RULES:
        if rule.pattern not in elsewhere and not rule.pattern.startswith("reward_model.reward_kwargs."):
            assert any(fnmatch.fnmatchcase(k, rule.pattern) for k in keys), rule.pattern
        if rule.when is None:  # only value-conditional rules apply to a key Tandem has
            shadowed = [k for k in KEYS.defaults if fnmatch.fnmatchcase(k, rule.pattern)]
            assert all(KEYS.has(k) for k in shadowed)  # control of the check below
            t = translate({k: KEYS.defaults[k] for k in shadowed}, KEYS)
            assert all(o.kind == HONOURED for o in t.outcomes), (rule.pattern, shadowed)


def test_verl_example_overrides_honoured_mapped_refused():
    lines = example()
    assert len(lines) == 39
    from omegaconf import OmegaConf as O

    from tandem.config.verl_compat import flatten

    user = {}
    for line in lines:
        user.update(flatten(O.from_dotlist([line])))
    t = translate(user, KEYS)
    assert kinds(t) == {HONOURED: 28, MAPPED: 11, REFUSED: 0, UNKNOWN: 0}
    mapped = {o.key: o.updates for o in t.of_kind(MAPPED)}
    assert mapped["trainer.n_gpus_per_node"] == {"services.actor.world_size": 8}
    assert set(mapped) == {
        "data.return_raw_chat", "actor_rollout_ref.model.use_fused_kernels",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.name",
        "actor_rollout_ref.rollout.mode", "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size",
        "actor_rollout_ref.ref.megatron.tensor_model_parallel_size", "trainer.n_gpus_per_node", "trainer.nnodes",
        "actor_rollout_ref.rollout.tensor_model_parallel_size"}


def verl_home(tmp_path):
    """$HOME/data/{gsm8k,math}/{train,test}.parquet and a tiny Qwen2 directory with a tokenizer."""
    import shutil

    from tiny_hf import tiny_qwen2

    from tandem.tasks.gsm8k_format import write_gsm8k_format

    paths = write_gsm8k_format(str(tmp_path / "src"), train_size=8, val_size=8)
    for name in ("gsm8k", "math"):
        (tmp_path / "data" / name).mkdir(parents=True)
        shutil.copy(paths["train"], tmp_path / "data" / name / "train.parquet")
        shutil.copy(paths["val"], tmp_path / "data" / name / "test.parquet")
    model = tiny_qwen2(tmp_path / "model", max_position_embeddings=2048)
    for f in pathlib.Path(paths["tokenizer"]).iterdir():
        shutil.copy(f, model / f.name)
    return str(tmp_path), str(model)


def test_verl_example_with_local_paths_loads(tmp_path):
    """Only paths changed, the example loads as it is: TP=2 x PP=2 (Hugging Face weights import per
    pipeline stage), generation on a TP=1 copy behind the pipeline; the reference must follow the actor."""
    home, model = verl_home(tmp_path)
    cfg, t = load_config_with_notices(None, example(home, model))
    megatron = cfg.actor_rollout_ref.actor.megatron
    assert (megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size) == (2, 2)
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert cfg.services.actor.world_size == 8 and cfg.trainer.total_training_steps is None
    assert cfg.trainer.total_epochs == 15 and cfg.data.train_files == [
        f"{home}/data/gsm8k/train.parquet", f"{home}/data/math/train.parquet"]
    assert cfg.actor_rollout_ref.rollout.mode == "colocated" and cfg.trainer.logger == ["console", "wandb"]
    # a notice for each mapped key set to something else than verl's default, or setting Tandem keys
    assert len(t.notices) == 8 and all(n.startswith("verl key ") and " -> " in n for n in t.notices)
    assert "verl key trainer.n_gpus_per_node=8 -> services." in "\n".join(t.notices)
    with pytest.raises(ConfigError, match="ref.megatron.pipeline_model_parallel_size=2: the reference lives"):
        load_config(None, example(home, model) + ["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1"])


def test_refusals_say_why_and_hints_point_the_right_way():
    t = taken(reward_model__sandbox_fusion__url="http://sandbox", reward_manager__module__path="/m.py",
              actor_rollout_ref__actor__megatron__virtual_pipeline_model_parallel_size=2,
              actor_rollout_ref__model__lora_rank=8)
    msgs = {o.key: o.message for o in t.outcomes}
    assert all(o.kind == REFUSED for o in t.outcomes)
    assert msgs["reward_model.sandbox_fusion.url"].startswith(
        "verl key 'reward_model.sandbox_fusion.url' is not supported by Tandem (")
    assert "custom_reward_function.path" in msgs["reward_manager.module.path"]
    assert "interleaved pipeline" in msgs["actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size"]
    assert "LoRA" in msgs["actor_rollout_ref.model.lora_rank"]
    # verl's values Tandem behaves as anyway are honoured (verl's default, or an accepted value)
    ok = taken(reward_model__enable=False, actor_rollout_ref__actor__megatron__context_parallel_size=2,
               trainer__val_before_train=True, actor_rollout_ref__actor__optim__optimizer="adamw")
    assert kinds(ok)[HONOURED] == 4
    # what the issue saw guessed the wrong way: now honoured or mapped, no guess
    right = taken(data__prompt_key="question", actor_rollout_ref__rollout__gpu_memory_utilization=0.7,
                  trainer__n_gpus_per_node=2, actor_rollout_ref__actor__megatron__param_offload=True)
    assert kinds(right)[UNKNOWN] == kinds(right)[REFUSED] == 0
    # a key neither Tandem nor verl has: the nearest names
    typo = taken(data__prompt_keys="q", actor_rollout_ref__rollout__temprature=0.5, rollout__temperature=1.0)
    hints = [o.message for o in typo.outcomes]
    assert "did you mean data.prompt_key?" in hints[0]
    assert "actor_rollout_ref.rollout.temperature" in hints[1]
    assert "actor_rollout_ref.rollout.temperature" in hints[2]  # the same leaf name elsewhere


def test_all_problems_in_one_error():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["bogus.key=1", "data.prompt_keys=q", "reward_model.sandbox_fusion.url=http://sandbox",
                           "data.train_batch_size=abc", "actor_rollout_ref.rollout.top_p=2", "trainer.nnodes="])
    msg = str(e.value)
    assert msg.startswith("6 config problems:"), msg
    for fragment in ("'bogus.key'", "'data.prompt_keys'", "'reward_model.sandbox_fusion.url' is not supported",
                     "'data.train_batch_size'", "actor_rollout_ref.rollout.top_p: must be in (0, 1]",
                     "trainer.nnodes: must be a whole number >= 1, got empty (an unset shell variable?)"):
        assert fragment in msg, (fragment, msg)


def test_mappings_set_tandem_keys_and_explicit_keys_win(tmp_path, monkeypatch):
    cfg = load_config(None, ["trainer.n_gpus_per_node=2", "algorithm.adv_estimator=gae",
                             "actor_rollout_ref.rollout.max_num_seqs=64", "trainer.save_freq=-1",
                             "trainer.test_freq=-1", "algorithm.rollout_correction.rollout_is=token",
                             "algorithm.rollout_correction.rollout_is_threshold=3.0", "data.seed=null",
                             "actor_rollout_ref.actor.use_prefix_grouper=true", "trainer.max_actor_ckpt_to_keep=2",
                             "trainer.max_critic_ckpt_to_keep=3"])
    assert (cfg.services.actor.world_size, cfg.services.critic.world_size, cfg.services.rollout.world_size) == (2, 2, 1)
    assert cfg.actor_rollout_ref.rollout.max_batch_size == 64 and (cfg.trainer.save_freq, cfg.trainer.test_freq) == (-1, 0)
    assert cfg.actor_rollout_ref.actor.tis_imp_ratio_cap == 3.0 and cfg.data.seed == 1
    assert cfg.trainer.max_ckpt_to_keep == 3  # one checkpoint holds both roles: the larger count
    with pytest.raises(ConfigError, match=r"trainer.max_ckpt_to_keep.*must be >= 1"):
        load_config(None, ["trainer.max_ckpt_to_keep=0"])
    cfg = load_config(None, ["trainer.n_gpus_per_node=4", "services.actor.world_size=2"])
    assert cfg.services.actor.world_size == 2
    # ref.megatron.* must be the actor's (the reference lives in the actor service)
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2: the "
                                          r"reference lives in the actor service.*must equal"):
        load_config(None, ["actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2"])
    # ~ in paths
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_config(None, ["trainer.default_local_dir=~/runs"]).trainer.default_local_dir == f"{tmp_path}/runs"


def test_the_docs_list_every_rule():
    from tandem.config.verl_compat import rules_markdown

    page = (ROOT / "docs" / "coming-from-verl.md").read_text()
    assert rules_markdown() in page, "regenerate docs/coming-from-verl.md's lists: python -m tandem.config.verl_compat"
