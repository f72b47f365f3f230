"""Defaults that depend on other keys, decided once when a config loads (the services get the
resolved values in the YAML the launcher writes, so every process splits batches the same way).

Micro-batches of the actor (the update, SFT, the old log-prob pass, and the reference's unless its
keys are set): by a token budget unless the user set a row count. Rows vary several-fold in RL, so
a budget bounds memory where a row count does not: at the 1.5B bench shape (bench/e2e_step.py) 256
rows ran out of an H200's memory while the budget ran at the fastest measured step
(bench/results/e2e_step.md). Rows stay where budgets cannot run: expert parallelism needs the same
number of micro-batches on every rank.
"""
from __future__ import annotations

from tandem.config.schema import TandemConfig

ROWS_WITHOUT_BUDGET = 256  # the actor's rows per micro-batch when budgets cannot run and none is set


def resolve(cfg: TandemConfig) -> None:
    a, d = cfg.actor_rollout_ref.actor, cfg.data
    if a.use_dynamic_bsz is None:
        a.use_dynamic_bsz = a.ppo_micro_batch_size_per_gpu is None and a.megatron.expert_model_parallel_size == 1
        if a.use_dynamic_bsz:  # chosen here: the budget holds the longest row a step can have
            a.ppo_max_token_len_per_gpu = max(a.ppo_max_token_len_per_gpu, d.max_prompt_length + d.max_response_length)
    if a.ppo_micro_batch_size_per_gpu is None:
        a.ppo_micro_batch_size_per_gpu = ROWS_WITHOUT_BUDGET
