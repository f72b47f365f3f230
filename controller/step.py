"""One PPO / GRPO step (DESIGN section 1) as the controller sequences it, in four phases:

1. rollout and scoring: n samples per prompt, scored by the reward service (ReMax: also a
   greedy baseline per prompt; DAPO: generation rounds until enough prompt groups with
   varied rewards are kept, controller/dapo.py);
2. log-probs and values: old and reference log-probs and the critic's values, concurrently;
3. advantages: KL to the reference in the reward (optional), then the configured estimator;
4. update: actor and critic concurrently, then the new weights to a standalone rollout.

Each phase is timed as `timing_s/<phase>`; then verl's data metrics and throughput.

Deliberately not here: decoding and scoring details (controller/scoring.py), the math
(tandem/algos/), validation, checkpoints and the loop over steps (controller/run.py).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from controller import scoring
from controller.dapo import collect_varied_groups
from controller.reward_calls import RowScores, settle
from controller.roles import Roles
from tandem.algos import advantages as adv_algos
from tandem.algos import kl as kl_algos
from tandem.algos import metrics as M
from tandem.config import TandemConfig
from tandem.data.batch import DataProto
from tandem.logging import get_logger

_log = get_logger("controller.step")

SEQ_KEYS = ["input_ids", "attention_mask", "responses", "response_mask"]
Prompts = DataProto | Callable[[int], DataProto]  # a batch, or k -> the next k prompts


@dataclass(frozen=True)
class StepContext:
    """What every step of a run works with."""

    roles: Roles
    cfg: TandemConfig
    tokenizer: object
    kl_ctrl: object  # tandem.algos.kl controller: its coefficient moves when KL is in the reward

    @property
    def n(self) -> int:
        return self.cfg.actor_rollout_ref.rollout.n

    @property
    def use_critic(self) -> bool:
        return self.cfg.algorithm.adv_estimator == "gae"

    @property
    def need_ref(self) -> bool:
        return self.cfg.actor_rollout_ref.actor.use_kl_loss or self.cfg.algorithm.use_kl_in_reward


@dataclass
class LogProbs:
    """Phase 2's outputs, one row per generated row."""

    old: DataProto  # old_log_probs [B, R]
    ref: DataProto | None  # ref_log_prob [B, R], when KL is in the loss or the reward
    values: DataProto | None  # values [B, R], with a critic


@dataclass
class Advantages:
    """Phase 3's outputs, all [B, R] over the response tokens."""

    mask: torch.Tensor  # response mask, float
    token_scores: torch.Tensor  # outcome reward on each row's last token
    rewards: torch.Tensor  # token_scores minus the KL penalty when it is in the reward
    advantages: torch.Tensor
    returns: torch.Tensor


@contextmanager
def timed(metrics: dict, name: str):
    t0 = time.perf_counter()
    yield
    metrics[f"timing_s/{name}"] = time.perf_counter() - t0


async def _maybe(coro):
    return await coro if coro is not None else None


async def ppo_step(ctx: StepContext, prompts: Prompts, step: int) -> dict[str, float]:
    """One step -> its metrics. `prompts` is a batch, or a function k -> the next k prompts
    (DAPO dynamic sampling may take several batches in one step)."""
    metrics: dict[str, float] = {}
    t_step = time.perf_counter()
    with timed(metrics, "gen"):
        gen, sampling_metrics = await rollout_and_score(ctx, prompts, step)
        metrics.update(sampling_metrics)
    metrics.setdefault(M.REWARD_FAILED_ROWS, float(gen.meta.get("reward_failed_rows", 0)))
    if len(gen) == 0:  # reward_model.on_failure=drop dropped every row: nothing to train on
        _log.warning("step.skipped", step=step, reason="no row could be scored")
        metrics["timing_s/step"] = time.perf_counter() - t_step
        return metrics
    metrics.update(scoring.reward_metrics(gen, ctx.cfg))
    seq = sequences(gen, ctx.cfg)
    with timed(metrics, "reward_logprob_values"):
        lp = await log_probs_and_values(ctx, seq)
    with timed(metrics, "adv"):
        adv, kl_metrics = compute_advantages(ctx, gen, lp)
        metrics.update(kl_metrics)
    metrics.update(M.rollout_probs_diff(gen["rollout_log_probs"], lp.old["old_log_probs"], adv.mask))
    actor_batch, critic_batch = update_batches(ctx, seq, gen, lp, adv)
    with timed(metrics, "update_actor_critic"):
        update_metrics = await update_actor_critic(ctx.roles, actor_batch, critic_batch)
    metrics.update(update_metrics)
    if ctx.roles.standalone_rollout:  # colocated, the rollout generates on the actor's own weights
        with timed(metrics, "sync_weights"):
            await ctx.roles.sync_rollout()
    metrics.update(data_metrics(ctx, gen, lp, adv))
    metrics.update(perf_metrics(gen, t_step))
    return metrics


# ---- phase 1: rollout and scoring -----------------------------------------------------------

async def rollout_and_score(ctx: StepContext, prompts: Prompts, step: int) -> tuple[DataProto, dict[str, float]]:
    """The step's scored generations, and DAPO's counts when dynamic sampling is on."""
    cfg = ctx.cfg
    seed = cfg.trainer.seed * 1_000_003 + step
    if cfg.algorithm.filter_groups.enable:
        return await collect_varied_groups(lambda batch, i: generate_and_score(ctx, batch, seed + 7919 * i),
                                           prompts, cfg, ctx.tokenizer.pad_token_id)
    batch = prompts(cfg.data.train_batch_size) if callable(prompts) else prompts
    return await generate_and_score(ctx, batch, seed), {}


async def generate_and_score(ctx: StepContext, prompts: DataProto, seed: int) -> DataProto:
    """n samples per prompt (rows prompt-major), scored. Adds per-row tensors `acc` (the
    verifier's score), `seq_reward` (acc + overlong penalty) and, for ReMax,
    `reward_baselines` (the shaped score of a greedy response to the same prompt). Rows that
    could not be scored fail the step or leave with their prompt group
    (reward_model.on_failure, controller/reward_calls.py); meta `reward_failed_rows` counts them."""
    roles, cfg, tokenizer = ctx.roles, ctx.cfg, ctx.tokenizer
    r, max_new = cfg.actor_rollout_ref.rollout, cfg.data.max_response_length
    gen = await roles.rollout.generate_sequences(
        prompts, max_new_tokens=max_new, n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=seed)

    async def greedy_baseline() -> tuple[RowScores, torch.Tensor]:
        base = await roles.rollout.generate_sequences(prompts, max_new_tokens=max_new, n=1, greedy=True)
        scored = await scoring.score(roles.reward, base, tokenizer, cfg)
        return scored, scoring.shaped_scores(scored.scores, base["response_mask"], cfg)

    remax = cfg.algorithm.adv_estimator == "remax"
    scored, baseline = await asyncio.gather(scoring.score(roles.reward, gen, tokenizer, cfg),
                                            _maybe(greedy_baseline() if remax else None))
    failures = dict(scored.failures)
    if remax:  # a prompt without a baseline cannot be trained on either
        failures.update({p * r.n + i: f"ReMax baseline: {why}" for p, why in baseline[0].failures.items()
                         for i in range(r.n)})
    keep = settle(RowScores(scored.scores, failures), r.n, cfg)
    gen.tensors["acc"] = scored.scores
    gen.tensors["seq_reward"] = scoring.shaped_scores(scored.scores, gen["response_mask"], cfg)
    if remax:
        gen.tensors["reward_baselines"] = baseline[1].repeat_interleave(r.n)
    if keep is not None:
        gen = gen.index(keep)
    gen.meta["reward_failed_rows"] = len(failures)
    return gen


def sequences(gen: DataProto, cfg: TandemConfig) -> DataProto:
    """The generated rows as the actor and critic take them."""
    seq = gen.select(tensor_keys=SEQ_KEYS)
    seq.meta = {"temperature": cfg.actor_rollout_ref.rollout.temperature, "rollout_n": cfg.actor_rollout_ref.rollout.n}
    return seq


# ---- phase 2: log-probs and values ----------------------------------------------------------

async def log_probs_and_values(ctx: StepContext, seq: DataProto) -> LogProbs:
    actor, critic = ctx.roles.actor, ctx.roles.critic
    old, ref, values = await asyncio.gather(
        actor.compute_log_prob(seq),
        _maybe(actor.compute_ref_log_prob(seq) if ctx.need_ref else None),
        _maybe(critic.compute_values(seq) if ctx.use_critic else None))
    return LogProbs(old, ref, values)


# ---- phase 3: advantages --------------------------------------------------------------------

def compute_advantages(ctx: StepContext, gen: DataProto, lp: LogProbs) -> tuple[Advantages, dict[str, float]]:
    """Token-level rewards (minus the KL penalty when it is in the reward; the KL controller
    then moves) and the estimator's advantages and returns -> (them, the KL metrics)."""
    alg = ctx.cfg.algorithm
    mask = gen["response_mask"].float()
    token_scores = scoring.token_level(gen["seq_reward"], mask)
    rewards, kl_metrics = token_scores, {}
    if alg.use_kl_in_reward:
        rewards, kl_metrics = kl_algos.apply_kl_penalty(
            token_scores, lp.old["old_log_probs"], lp.ref["ref_log_prob"], mask, ctx.kl_ctrl, alg.kl_penalty)
        ctx.kl_ctrl.update(kl_metrics["actor/reward_kl_penalty"], n_steps=len(gen) // ctx.n)
    # every estimator gets what it takes of these (group ids: rows are prompt-major)
    advantages, returns = adv_algos.compute_advantage(
        alg.adv_estimator, token_level_rewards=rewards, response_mask=mask,
        values=lp.values["values"] if ctx.use_critic else None, index=torch.arange(len(gen)) // ctx.n,
        reward_baselines=gen.tensors.get("reward_baselines"),
        gamma=alg.gamma, lam=alg.lam, norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)
    return Advantages(mask, token_scores, rewards, advantages, returns), kl_metrics


# ---- phase 4: update ------------------------------------------------------------------------

def update_batches(ctx: StepContext, seq: DataProto, gen: DataProto, lp: LogProbs,
                   adv: Advantages) -> tuple[DataProto, DataProto | None]:
    """-> (the actor's update batch, the critic's or None without a critic)."""
    actor = ctx.cfg.actor_rollout_ref.actor
    train = seq.union(lp.old.select(tensor_keys=["old_log_probs"]))
    train.tensors["advantages"] = adv.advantages.float()
    if actor.use_kl_loss:
        train.tensors["ref_log_prob"] = lp.ref["ref_log_prob"]
    if actor.tis_imp_ratio_cap > 0:
        train.tensors["rollout_log_probs"] = gen["rollout_log_probs"]
    if not ctx.use_critic:
        return train, None
    critic = seq.select(tensor_keys=SEQ_KEYS)
    critic.meta = dict(seq.meta)
    critic.tensors.update(values=lp.values["values"], returns=adv.returns.float())
    return train, critic


async def update_actor_critic(roles: Roles, actor_batch: DataProto,
                              critic_batch: DataProto | None) -> dict[str, float]:
    (actor_metrics, _version), critic_metrics = await asyncio.gather(
        roles.actor.update_actor(actor_batch),
        _maybe(roles.critic.update_critic(critic_batch) if critic_batch is not None else None))
    return {**actor_metrics, **(critic_metrics or {})}


# ---- metrics --------------------------------------------------------------------------------

def data_metrics(ctx: StepContext, gen: DataProto, lp: LogProbs, adv: Advantages) -> dict[str, float]:
    """verl's critic/, response_length/ and prompt_length/ statistics of the step's batch."""
    tensors = {"token_level_scores": adv.token_scores, "token_level_rewards": adv.rewards,
               "advantages": adv.advantages, "returns": adv.returns, "response_mask": adv.mask,
               "prompt_mask": gen["attention_mask"][:, : gen["prompts"].shape[1]].float()}
    if ctx.use_critic:
        tensors["values"] = lp.values["values"]
    return M.compute_data_metrics(tensors, use_critic=ctx.use_critic,
                                  max_response_length=ctx.cfg.data.max_response_length)


def perf_metrics(gen: DataProto, t_step: float) -> dict[str, float]:
    """timing_s/step (since `t_step`), tokens in the batch and tokens per second."""
    step_s = time.perf_counter() - t_step
    tokens = float(gen["attention_mask"].sum())
    return {"timing_s/step": step_s, "perf/total_num_tokens": tokens, "perf/throughput": tokens / step_s}
