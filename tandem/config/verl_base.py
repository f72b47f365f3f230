"""verl's defaults as a run's starting point, and every default of Tandem's that differs from verl's.

verl's scripts name verl's config (`--config-name ppo_megatron_trainer`): such a run starts from
verl's defaults (verl_defaults.yaml) for every key the user leaves unset, as verl would, except
where Tandem cannot take verl's value (NOT_TAKEN, why). A plain `tandem run` starts from Tandem's
own defaults, which are sized for the built-in task; DIFFERENCES says why each one differs from
verl's, and docs/coming-from-verl.md's table is generated from it (python -m tandem.config.verl_base).
"""
from __future__ import annotations

import copy
import json
from typing import Any

from tandem.config.verl_compat import TandemKeys, classify, overlaps, verl_defaults
from tandem.config.verl_keys import HONOURED, MAPPED

VERL_CONFIG_NAMES = ("ppo_megatron_trainer",)

A, C, R = "actor_rollout_ref.actor", "critic", "actor_rollout_ref.rollout"
# verl's interpolations among these keys: unset, the key takes its source's value (the user's or verl's)
FOLLOWS = {
    "critic.ppo_mini_batch_size": f"{A}.ppo_mini_batch_size", "critic.ppo_epochs": f"{A}.ppo_epochs",
    "critic.use_dynamic_bsz": f"{A}.use_dynamic_bsz", "critic.loss_agg_mode": f"{A}.loss_agg_mode",
    "critic.forward_max_token_len_per_gpu": "critic.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": f"{A}.use_dynamic_bsz",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": f"{A}.ppo_max_token_len_per_gpu",
    "reward_model.megatron.seed": f"{A}.megatron.seed",
}

AUTO_DTYPE = "auto is verl's bfloat16 on GPUs; on CPUs it is float32 (megatron-core's bf16 optimizer needs CUDA)"
VERL_UNSET = "verl has no default (its scripts set one); Tandem's is a size that runs"
# verl's defaults a run named by verl's config does not take, and why
NOT_TAKEN = {
    f"{A}.megatron.dtype": AUTO_DTYPE, "critic.megatron.dtype": AUTO_DTYPE, "reward_model.megatron.dtype": AUTO_DTYPE,
    f"{R}.tensor_model_parallel_size": "verl's is its vLLM engine's TP; a colocated rollout generates on the "
                                       "actor's modules, at the actor's TP (null) or 1",
}

BUILTIN = "sized for the built-in task (a 4-layer, 64-wide model learning addition on CPU)"
MODEL = "none: the built-in task's model shape (actor_rollout_ref.model.*)"
DATA = "none: the built-in task's data, written at start"
# every default of Tandem's that differs from verl's (tests/unit/test_verl_base.py keeps this complete)
DIFFERENCES = {
    f"{A}.optim.lr": BUILTIN, f"{A}.optim.weight_decay": BUILTIN, f"{A}.optim.lr_warmup_steps": BUILTIN,
    f"{A}.ppo_mini_batch_size": BUILTIN,
    f"{A}.use_dynamic_bsz": "null: micro-batches by a token budget unless ppo_micro_batch_size_per_gpu is set (rows "
                           "vary several-fold in RL; 256 rows ran out of memory at 1.5B where the budget ran fastest)",
    f"{A}.ppo_max_token_len_per_gpu": "the budget measured fastest at 0.5B and 1.5B on an H200 "
                                      "(bench/results/e2e_step.md); raised to the longest row when chosen by default",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": VERL_UNSET,
    f"{A}.megatron.dtype": AUTO_DTYPE, "critic.megatron.dtype": AUTO_DTYPE, "reward_model.megatron.dtype": AUTO_DTYPE,
    f"{A}.megatron.seed": BUILTIN, "critic.megatron.seed": BUILTIN, "reward_model.megatron.seed": "as the actor's",
    f"{A}.megatron.use_distributed_optimizer": "Tandem's runs and tests train with the plain optimizer (the "
    "distributed one is tested at DP=2 on CPU); the two write checkpoints that load only into their own kind",
    "critic.megatron.use_distributed_optimizer": "as the actor's",
    f"{R}.free_cache_engine": "the KV cache stays allocated between generations (no allocation per step); "
                              "true frees it when the next call is not a generation",
    f"{R}.tensor_model_parallel_size": NOT_TAKEN[f"{R}.tensor_model_parallel_size"],
    f"{R}.n": BUILTIN + "; GRPO needs n >= 2",
    f"{R}.multi_turn.format": "auto: hermes when the tokenizer has a </tool_call> token, else the built-in "
                              "task's calculator format", "algorithm.adv_estimator": BUILTIN,
    "actor_rollout_ref.model.path": MODEL, "data.train_files": DATA, "data.val_files": DATA,
    "data.max_prompt_length": BUILTIN, "data.max_response_length": BUILTIN, "data.train_batch_size": BUILTIN,
    "data.seed": "verl: null; Tandem seeds its shuffled epochs with it",
    "data.filter_overlong_prompts": "an overlong prompt is dropped and counted; verl's false with "
                                    "truncation=error stops the run at the first one",
    "critic.optim.lr": BUILTIN, "critic.optim.weight_decay": BUILTIN, "critic.ppo_mini_batch_size": BUILTIN,
    "critic.ppo_micro_batch_size_per_gpu": VERL_UNSET, "reward_model.micro_batch_size_per_gpu": VERL_UNSET,
    "trainer.total_epochs": BUILTIN, "trainer.total_training_steps": BUILTIN, "trainer.test_freq": BUILTIN,
    "trainer.project_name": "Tandem's own name", "trainer.experiment_name": "the built-in task's name",
    "trainer.logger": "wandb is an extra (pip install tandem[wandb]) and needs an account or WANDB_MODE=offline; "
                      "Tandem's sinks need nothing",
    "trainer.save_freq": "crash recovery: a checkpoint every 10 steps bounds the work a crash loses "
                         "(trainer.max_restarts)",
    "trainer.resume_mode": "a run starts fresh unless asked (auto: the newest run of this experiment_name)",
    "trainer.default_local_dir": "each run gets a directory under it (metrics, logs, checkpoints)",
}
# defaults that differ only in how they are written (the same behaviour)
SAME = {
    f"{A}.clip_ratio_low": "null: clip_ratio (0.2)", f"{A}.clip_ratio_high": "null: clip_ratio (0.2)",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": "null: the actor's, as verl interpolates it",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "null: the actor's, as verl interpolates it",
    f"{R}.mode": "verl's async and Tandem's colocated both generate on the actor's GPUs",
    "critic.optim.lr_warmup_steps": "verl's -1 is lr_warmup_steps_ratio's 0 steps",
    "reward_model.model.path": "read only with reward_model.enable=true (false in both)",
}


def base_settings(user: dict[str, Any], deleted: set[str], keys: TandemKeys) -> dict[str, Any]:
    """Tandem keys set from verl's defaults for every verl key the user left unset (or deleted)."""
    merged = copy.deepcopy({**verl_defaults(), **user})
    for key, source in FOLLOWS.items():
        if key not in user:
            merged[key] = merged.get(source)

    def get(key: str) -> Any:
        return merged[key] if key in merged else keys.defaults.get(key)

    out: dict[str, Any] = {}
    for key in verl_defaults():
        if key in NOT_TAKEN or any(overlaps(key, k) for k in (*user, *deleted)):
            continue
        outcome = classify(key, merged[key], keys, get)
        if outcome.kind in (HONOURED, MAPPED):  # a refused default is verl's own: not the user's problem
            out.update(outcome.updates)
    return out


def differing_keys() -> list[str]:
    """The keys Tandem and verl both have whose defaults differ (SAME aside)."""
    keys = TandemKeys.of_schema()
    return sorted(k for k, v in verl_defaults().items()
                  if k in keys.defaults and k not in SAME and keys.defaults[k] != v)


def defaults_markdown() -> str:
    """docs/coming-from-verl.md's table of Tandem's defaults that differ from verl's."""
    keys = TandemKeys.of_schema()
    base = base_settings({}, set(), keys)

    def shown(value: Any) -> str:
        return f"`{json.dumps(value)}`"

    lines = ["| key | verl | `tandem run` | with `--config-name ppo_megatron_trainer` | why Tandem's differs |",
             "| --- | --- | --- | --- | --- |"]
    for key in differing_keys():
        verl, ours = verl_defaults()[key], keys.defaults[key]
        named = base.get(key, ours)
        named = "verl's" if named == verl else shown(named)
        why = DIFFERENCES.get(key, "").replace("|", "\\|")
        lines.append(f"| `{key}` | {shown(verl)} | {shown(ours)} | {named} | {why} |")
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    print(defaults_markdown(), end="")
