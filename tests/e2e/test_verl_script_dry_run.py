"""verl's Megatron GRPO example (examples/grpo_trainer/run_qwen2-7b_math_megatron.sh) as its shell hands it to
`python -m verl.trainer.main_ppo`, verbatim but for the model and data paths (tiny local files), through
`tandem run --dry-run`: the command line is taken whole (Hydra's grammar, --config-path / --config-name), the
example's layout (TP=2 x PP=2, Hugging Face weights imported per pipeline stage) with it, and the resolved
config is printed; a bad value in it is a config error, exit 2."""
import os
import subprocess
import sys

import yaml
from test_verl_compat_run import example_overrides, verl_example_files

# what the script passes before its overrides (the shell removes the quotes)
VERL_CONFIG = ["--config-path=config", "--config-name=ppo_megatron_trainer.yaml"]


def dry_run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tandem.controller", "run", "--dry-run", *args],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))


def test_the_verbatim_command_line_is_taken(tmp_path):
    home, model = verl_example_files(tmp_path)
    argv = [*VERL_CONFIG, *example_overrides(home, model)]
    passed = dry_run(argv)
    assert passed.returncode == 0, passed.stderr[-3000:]
    cfg = yaml.safe_load(passed.stdout)
    megatron = cfg["actor_rollout_ref"]["actor"]["megatron"]
    assert (megatron["tensor_model_parallel_size"], megatron["pipeline_model_parallel_size"]) == (2, 2)
    assert cfg["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] == 1  # behind PP: a TP=1 copy
    assert cfg["data"]["train_files"] == [f"{home}/data/gsm8k/train.parquet", f"{home}/data/math/train.parquet"]
    assert cfg["actor_rollout_ref"]["rollout"]["n"] == 5 and cfg["services"]["actor"]["world_size"] == 8
    assert cfg["trainer"]["sft"]["total_steps"] == "auto"  # resolved to 0 (user's data) with the run directory
    assert cfg["trainer"]["resume_mode"] == "auto" and cfg["trainer"]["total_training_steps"] is None  # verl's
    for notice in ("tandem: verl key actor_rollout_ref.rollout.name='vllm' -> ",
                   "tandem: verl key actor_rollout_ref.rollout.tensor_model_parallel_size=2 -> ",
                   "tandem: started from verl's defaults", "megatron.dtype=auto -> float32",
                   "tandem: dry run: the config is valid; nothing was started"):
        assert notice in passed.stderr, (notice, passed.stderr[-3000:])
    failed = dry_run([*argv, "data.train_batch_size=1000"])  # 1000 prompts do not split into 256-prompt updates
    assert failed.returncode == 2 and not failed.stdout and "Traceback" not in failed.stderr
    assert "actor_rollout_ref.actor.ppo_mini_batch_size: 256 must divide data.train_batch_size=1000" in failed.stderr
