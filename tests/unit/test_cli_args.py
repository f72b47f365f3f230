"""`tandem run`'s command line as verl's scripts write it (tandem/config/cli_args.py, overrides.py):
Hydra's override grammar, --config-path / --config-name, --dry-run, and every problem in one report."""
import pytest
import yaml

from tandem.config import ConfigError, load_config, load_config_with_notices
from tandem.config.cli_args import parse_run_args
from tandem.config.overrides import Override, parse_overrides
from tandem.controller.__main__ import main


def test_hydra_forms_and_values():
    parsed = parse_overrides(["a.b=1", "+a.c=x", "++a.d=[1,2]", "~a.e", "~a.f=3", "a.g=", "a.h=null", "a.i='x y'",
                              "a.j=1e-6", "a.k={x: 1}", "a.l=0,1", "a.m=~/runs", 'a.n="token-mean"'])
    assert not parsed.problems, parsed.problems
    assert parsed.overrides == [
        Override("a.b", 1), Override("a.c", "x"), Override("a.d", [1, 2]), Override("a.e", delete=True),
        Override("a.f", delete=True), Override("a.g", ""), Override("a.h", None), Override("a.i", "x y"),
        Override("a.j", 1e-6), Override("a.k", {"x": 1}), Override("a.l", "0,1"), Override("a.m", "~/runs"),
        Override("a.n", "token-mean")]


def test_overrides_hydra_cannot_take_are_named():
    parsed = parse_overrides(["novalue", "x=[a", "a@pkg=1", "group/name=x", "a=range(3)", "hydra.run.dir=out",
                              "trainer.logger=['console','wandb]"])
    problems = "\n".join(parsed.problems)
    assert len(parsed.problems) == 6 and not parsed.overrides, problems
    for fragment in ("'novalue' is not valid override syntax", "(an override is key=value)", "'x=[a'",
                     "'a@pkg=1': package overrides", "'group/name=x': config-group overrides",
                     "'a=range(3)' is a sweep", "trainer.logger=['console','wandb]"):
        assert fragment in problems, fragment
    assert parsed.notices == ["hydra.run.dir=out: Hydra's own settings (its output and log directories) are not "
                              "used; a run writes under trainer.default_local_dir"]


def test_config_path_and_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_run_args(["--config-path=config", "--config-name='ppo_megatron_trainer.yaml'"]).problems
    args = parse_run_args(["--config-path=config", "--config-name=ppo_megatron_trainer.yaml", "a=1", "--dry-run",
                           "~b"])
    assert (args.verl_config, args.config_file, args.dry_run, args.overrides, args.problems) == \
        ("ppo_megatron_trainer", None, True, ["a=1", "~b"], [])
    assert parse_run_args(["-cp", "config", "-cn", "ppo_megatron_trainer"]).verl_config == "ppo_megatron_trainer"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "job.yaml").write_text("data: {seed: 3}\n")
    assert parse_run_args(["--config-path", "mine", "--config-name", "job"]).config_file == "mine/job.yaml"
    assert parse_run_args(["job.yaml", "a=1"]).problems == ["config file 'job.yaml' does not exist"]
    (tmp_path / "job.yaml").write_text("data: {seed: 3}\n")
    assert parse_run_args(["job.yaml", "a=1"]).config_file == "job.yaml"  # Tandem's own form
    problems = parse_run_args(["--config-name=ppo_trainer", "--config-name", "--multirun", "--bogus=1"]).problems
    assert len(problems) == 4 and "--config-name needs a value" in problems[0], problems
    assert "--multirun: sweeps" in problems[1] and "unknown option '--bogus=1'" in problems[2]
    assert problems[3].startswith("--config-name ppo_trainer: verl's FSDP trainer config")
    assert "there is no ./nope.yaml" in parse_run_args(["--config-name=nope"]).problems[0]


def test_a_deletion_brings_the_default_back_and_a_hydra_yaml_names_verl(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"defaults": ["ppo_megatron_trainer", "_self_"], "hydra": {"run": {"dir": "x"}},
                                    "data": {"seed": 5, "max_prompt_length": 20}}))
    built_in_shape = ["actor_rollout_ref.model.path=null", "actor_rollout_ref.model.max_position_embeddings=64"]
    cfg, taken = load_config_with_notices(str(path), ["~data.seed", "data.max_response_length=8", *built_in_shape])
    assert cfg.data.seed == 1 and cfg.data.max_prompt_length == 20  # Tandem's default back; the YAML's value
    assert cfg.actor_rollout_ref.rollout.n == 1 and cfg.data.train_batch_size == 1024  # verl's defaults
    assert any("hydra: section" in n for n in taken.notices) and any("verl's defaults" in n for n in taken.notices)
    path.write_text(yaml.safe_dump({"defaults": ["ppo_megatron_trainer", {"actor": "dp_actor"}]}))
    with pytest.raises(ConfigError, match="defaults entry {'actor': 'dp_actor'}: Tandem reads one YAML file"):
        load_config(str(path))


def test_dry_run_prints_the_resolved_config_and_starts_nothing(capsys):
    assert main(["run", "--dry-run", "trainer.total_training_steps=3", "trainer.logger=console"]) == 0
    out, err = capsys.readouterr()
    resolved = yaml.safe_load(out)
    assert resolved["trainer"]["total_training_steps"] == 3 and resolved["trainer"]["logger"] == ["console"]
    assert "megatron.dtype=auto -> float32 (no GPU here" in err and "dry run: the config is valid" in err


def test_every_problem_in_one_report_across_topics(capsys, tmp_path):
    assert main(["run", "--dry-run", "--bogus", "trainer.n_gpus_per_node=", "data.prompt_keys=q",
                 "actor_rollout_ref.rollout.top_p=2", f"data.train_files={tmp_path}/none.parquet",
                 "actor_rollout_ref.actor.megatron.override_transformer_config.apply_rope_fusion=true"]) == 2
    err = capsys.readouterr().err
    for fragment in ("6 config problems", "unknown option '--bogus'",
                     "trainer.n_gpus_per_node: must be a whole number >= 1, got empty (an unset shell variable?)",
                     "'data.prompt_keys'", "actor_rollout_ref.rollout.top_p: must be in (0, 1]",
                     "data.train_files: ", "none.parquet' does not exist",
                     "override_transformer_config.apply_rope_fusion: True: needs fused kernels"):
        assert fragment in err, (fragment, err)
    assert "Traceback" not in err
