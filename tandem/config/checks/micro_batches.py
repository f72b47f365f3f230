"""Checks of the micro-batch token budgets (verl's use_dynamic_bsz and *_max_token_len_per_gpu).

A budget must hold the longest row a step can have (data.max_prompt_length + max_response_length):
rows are never cut. Expert parallelism needs the same number of micro-batches on every data-parallel
rank (tandem/serving/dispatch.py check_lockstep), which budgets over rows of different lengths do not give.
"""
from __future__ import annotations

from tandem.config.errors import check
from tandem.config.schema import TandemConfig


def check_micro_batches(cfg: TandemConfig) -> None:
    a, ref, c, d = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.ref, cfg.critic, cfg.data
    longest = d.max_prompt_length + d.max_response_length
    # the reference's keys unset follow the actor's (as tandem/train/microbatch.py ref_split)
    ref_dynamic = a.use_dynamic_bsz if ref.log_prob_use_dynamic_bsz is None else ref.log_prob_use_dynamic_bsz
    budgets = [("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu),
               ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", ref_dynamic,
                ref.log_prob_max_token_len_per_gpu or a.ppo_max_token_len_per_gpu),
               ("critic.ppo_max_token_len_per_gpu", c.use_dynamic_bsz, c.ppo_max_token_len_per_gpu),
               ("critic.forward_max_token_len_per_gpu", c.use_dynamic_bsz, c.forward_max_token_len_per_gpu)]
    for key, dynamic, budget in budgets:
        if dynamic:
            check(budget >= longest, key, f"{budget} tokens cannot hold a row of data.max_prompt_length + "
                  f"data.max_response_length = {longest} tokens (rows are never cut); set at least {longest}")
    check(ref.log_prob_max_token_len_per_gpu is None or ref.log_prob_max_token_len_per_gpu >= 1,
          "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "must be >= 1 (or unset: the actor's)")
    for key, dynamic, ep in (("actor_rollout_ref.actor.use_dynamic_bsz", a.use_dynamic_bsz or ref_dynamic,
                              a.megatron.expert_model_parallel_size),
                             ("critic.use_dynamic_bsz", c.use_dynamic_bsz, c.megatron.expert_model_parallel_size)):
        check(not dynamic or ep == 1, key, f"token budgets with expert_model_parallel_size={ep}: every data-parallel "
              "rank must run the same number of micro-batches (the experts' all-to-all spans them); set "
              "ppo_micro_batch_size_per_gpu / log_prob_micro_batch_size_per_gpu instead")
