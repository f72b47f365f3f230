"""One PPO / GRPO step as the controller sequences it, top to bottom (`ppo_step`):

1. generate: n samples per prompt. A colocated rollout is the actor itself: it keeps the rows and
   queues its log-prob pass right behind the generation, so the rows never travel back to it.
2. log-probs and values (controller/log_probs.py), started as soon as the rows exist, while the
   reward service scores them: old and reference log-probs in one actor call, the critic's values.
   The actor leaves out the rows its update trains on the weights that generated them (its own
   forward gives their old log-probs, bit for bit).
3. score: the reward service's scores, shaped (overlong penalty; ReMax: a greedy baseline rollout
   scored meanwhile); rows that could not be scored fail the step or leave with their prompt group
   (controller/reward_calls.py). DAPO: rounds of 1 and 3 until enough varied groups are kept
   (controller/dapo.py), then 2.
4. advantages: KL to the reference in the reward (optional), then the configured estimator. They
   wait for phase 2 only when they read it (a critic's values, KL in the reward).
5. update: actor and critic concurrently. The actor's request leaves as soon as the advantages are
   known; on kept rows it queues behind the actor's own pass (no GPU gap for a round trip), on rows
   sent it carries phase 2's log-probs. Then the new weights to a standalone rollout.

The asynchronous loop (controller/async_train.py) runs 1 and 3 on its producer and `train_on`
(2, 4, 5) on its consumer, on the same code.

Timings carry verl's names (`timing_s/{gen,reward,old_log_prob,ref,values,adv,update_critic,
update_actor,update_weights,step}`); calls that run concurrently are each timed on their own, so
they overlap. Then verl's data metrics and `perf/{total_num_tokens,time_per_step,throughput}`.

Deliberately not here: decoding and scoring details (controller/scoring.py), the math
(tandem/algos/), validation, checkpoints and the loop over steps (controller/run.py).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext

import torch

from tandem.algos import advantages as adv_algos
from tandem.algos import kl as kl_algos
from tandem.algos import metrics as M
from tandem.controller import scoring
from tandem.controller.dapo import collect_varied_groups
from tandem.controller.log_probs import LogProbs, Phase2, keep_settings
from tandem.controller.reward_calls import RowScores, settle
from tandem.controller.step_context import Advantages, StepContext
from tandem.controller.step_metrics import data_metrics, perf_metrics
from tandem.controller.step_timing import maybe, timed, timed_await
from tandem.data.batch import DataProto
from tandem.logging import get_logger
from tandem.rollout.outputs import SEQ_KEYS

_log = get_logger("controller.step")

Prompts = DataProto | Callable[[int], DataProto]  # a batch, or k -> the next k prompts


async def ppo_step(ctx: StepContext, prompts: Prompts, step: int) -> dict[str, float]:
    """One step -> its metrics. `prompts` is a batch, or a function k -> the next k prompts
    (DAPO dynamic sampling may take several batches in one step)."""
    metrics: dict[str, float] = {}
    t_step = time.perf_counter()
    gen, phase2 = await rollout_and_score(ctx, prompts, step, metrics)
    if nothing_to_train(gen, step, metrics):
        if phase2 is not None:
            phase2.cancel()
        metrics[M.TIMING_STEP] = time.perf_counter() - t_step
        return metrics
    version = await train_on(ctx, gen, step, metrics, phase2=phase2)
    if ctx.roles.standalone_rollout and version is not None:  # colocated: the rollout uses the actor's weights
        with timed(metrics, M.TIMING_UPDATE_WEIGHTS):  # verl's name for the phase; the sync's own: weight_sync
            metrics.update(await ctx.roles.sync_rollout(version))
    metrics.update(perf_metrics(gen, t_step, ctx.n_gpus))
    return metrics


def nothing_to_train(gen: DataProto, step: int, metrics: dict[str, float]) -> bool:
    """Count the rows that could not be scored; True when none is left (reward_model.on_failure=drop
    dropped every row) and the step trains on nothing."""
    metrics.setdefault(M.REWARD_FAILED_ROWS, float(gen.meta.get("reward_failed_rows", 0)))
    if len(gen) == 0:
        _log.warning("step.skipped", step=step, reason="no row could be scored")
    return len(gen) == 0


async def train_on(ctx: StepContext, gen: DataProto, step: int, metrics: dict[str, float],
                   update_guard: AbstractAsyncContextManager | None = None,
                   phase2: Phase2 | None = None) -> int | None:
    """Phases 2, 4 and 5 on a scored batch with rows, its metrics added to `metrics` -> the actor's
    weights version after its update (None: the actor did not update, trainer.critic_warmup).
    `phase2`: started when the rows were generated (None: started here, on rows sent);
    `update_guard` is held around the update (the asynchronous loop keeps weight syncs out of it)."""
    metrics.update(scoring.reward_metrics(gen, ctx.cfg))
    phase2 = phase2 or Phase2(ctx, gen, step, metrics)
    try:
        with timed(metrics, M.TIMING_ADV):
            read = await phase2.result() if ctx.use_critic or ctx.cfg.algorithm.use_kl_in_reward else None
            adv, kl_metrics = compute_advantages(ctx, gen, read)
        metrics.update(kl_metrics)
        async with update_guard or nullcontext():
            version, old = await update_actor_critic(ctx, phase2, gen, adv, step, metrics)
        lp = await phase2.result()
    except BaseException:
        phase2.cancel()
        raise
    if old is not None:  # the old log-probs as the update used them: the rows it computed itself filled in
        lp.old = old
    metrics.update(M.rollout_probs_diff(gen["rollout_log_probs"], lp.old["old_log_probs"], adv.mask))
    metrics.update(data_metrics(ctx, gen, lp, adv))
    return version


# ---- phases 1 and 3: rollout and scoring ----------------------------------------------------

async def rollout_and_score(ctx: StepContext, prompts: Prompts, step: int, timings: dict | None = None,
                            start_phase2: bool = True) -> tuple[DataProto, Phase2 | None]:
    """The step's scored generations and their phase 2, started on them (None without
    `start_phase2`, and with DAPO's dynamic sampling: its rows are known after its rounds; its
    counts go to `timings`, with timing_s/gen and timing_s/reward, summed over the rounds)."""
    cfg, timings = ctx.cfg, {} if timings is None else timings
    seed = cfg.trainer.seed * 1_000_003 + step
    if cfg.algorithm.filter_groups.enable:
        gen, counts = await collect_varied_groups(
            lambda batch, i: generate_and_score(ctx, batch, seed + 7919 * i, timings),
            prompts, cfg, ctx.tokenizer.pad_token_id)
        timings.update(counts)
        return gen, None
    batch = prompts(cfg.data.train_batch_size) if callable(prompts) else prompts
    started: list[Phase2] = []

    def start(rows: DataProto) -> Phase2:
        started.append(Phase2(ctx, rows, step, timings))
        return started[0]

    try:
        gen = await generate_and_score(ctx, batch, seed, timings, start if start_phase2 else None,
                                       keep_settings(ctx, step) if not ctx.roles.standalone_rollout else None)
    except BaseException:
        for phase2 in started:  # the step fails: its log-probs are not waited for
            phase2.cancel()
        raise
    return gen, started[0] if started else None


async def generate_and_score(ctx: StepContext, prompts: DataProto, seed: int, timings: dict | None = None,
                             generated: Callable[[DataProto], Phase2] | None = None,
                             keep: dict | None = None) -> DataProto:
    """n samples per prompt (rows prompt-major), scored. Adds per-row tensors `acc` (the
    verifier's score), `seq_reward` (acc + overlong penalty) and, for ReMax,
    `reward_baselines` (the shaped score of a greedy response to the same prompt). Rows that
    could not be scored fail the step or leave with their prompt group (reward_model.on_failure,
    controller/reward_calls.py); meta `reward_failed_rows` counts them. `generated(rows)` starts
    phase 2 before scoring (told the rows scoring keeps); `keep`: the colocated actor keeps the rows."""
    roles, cfg, tokenizer, timings = ctx.roles, ctx.cfg, ctx.tokenizer, {} if timings is None else timings
    r, max_new = cfg.actor_rollout_ref.rollout, cfg.data.max_response_length
    with timed(timings, M.TIMING_GEN):
        gen = await roles.rollout.generate_sequences(
            prompts, max_new_tokens=max_new, n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
            seed=seed, keep=keep)
    phase2 = generated(gen) if generated is not None else None

    async def greedy_baseline() -> tuple[RowScores, torch.Tensor]:
        base = await roles.rollout.generate_sequences(prompts, max_new_tokens=max_new, n=1, greedy=True)
        scored = await scoring.score(roles.reward, base, tokenizer, cfg)
        return scored, scoring.shaped_scores(scored.scores, scoring.response_tokens(base), cfg)

    remax = cfg.algorithm.adv_estimator == "remax"
    with timed(timings, M.TIMING_REWARD):  # ReMax's greedy baseline rollout is scored meanwhile
        scored, baseline = await asyncio.gather(scoring.score(roles.reward, gen, tokenizer, cfg),
                                                maybe(greedy_baseline() if remax else None))
    failures = dict(scored.failures)
    if remax:  # a prompt without a baseline cannot be trained on either
        failures.update({p * r.n + i: f"ReMax baseline: {why}" for p, why in baseline[0].failures.items()
                         for i in range(r.n)})
    keep_rows = settle(RowScores(scored.scores, failures), r.n, cfg)
    gen.tensors["acc"] = scored.scores
    gen.tensors["seq_reward"] = scoring.shaped_scores(scored.scores, scoring.response_tokens(gen), cfg)
    if remax:
        gen.tensors["reward_baselines"] = baseline[1].repeat_interleave(r.n)
    if keep_rows is not None:
        gen = gen.index(keep_rows)
    if phase2 is not None:
        phase2.pick(keep_rows)
    gen.meta["reward_failed_rows"] = len(failures)
    return gen


# ---- phase 4: advantages --------------------------------------------------------------------

def compute_advantages(ctx: StepContext, gen: DataProto, lp: LogProbs | None) -> tuple[Advantages, dict[str, float]]:
    """Token-level rewards (minus the KL penalty when it is in the reward; the KL controller
    then moves) and the estimator's advantages and returns -> (them, the KL metrics). `lp`:
    phase 2's results, when the reward's KL or the critic's values are read (else None)."""
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
    read = {}  # what the advantages read of phase 2 (the actor checks what its update reads)
    if alg.use_kl_in_reward:
        read.update({"old_log_probs (the actor)": lp.old["old_log_probs"],
                     "ref_log_prob (the actor's reference)": lp.ref["ref_log_prob"]})
    if ctx.use_critic:
        read["values (the critic)"] = lp.values["values"]
    check_finite({"seq_reward (the reward service's scores)": gen["seq_reward"], **read,
                  "token_level_rewards": rewards, "advantages": advantages, "returns": returns}, mask)
    return Advantages(mask, token_scores, rewards, advantages, returns), kl_metrics


def check_finite(tensors: dict[str, torch.Tensor], mask: torch.Tensor) -> None:
    """ValueError naming the first tensor (in the order data flows) with NaN or inf where it
    counts ([B] per row, or [B, R] on response tokens), and the rows, before any update sees it."""
    for name, t in tensors.items():
        bad = ~torch.isfinite(t) & mask.bool() if t.dim() == 2 else ~torch.isfinite(t)
        rows = bad.reshape(len(t), -1).any(-1).nonzero().flatten().tolist()
        if rows:
            raise ValueError(f"advantages: not computed: '{name}' has NaN or inf in rows {rows[:8]}"
                             + (f" (and {len(rows) - 8} more)" if len(rows) > 8 else ""))


# ---- phase 5: update ------------------------------------------------------------------------

async def update_actor_critic(ctx: StepContext, phase2: Phase2, gen: DataProto, adv: Advantages, step: int,
                              metrics: dict) -> tuple[int | None, DataProto | None]:
    """The actor's and the critic's updates, concurrently (each timed on its own; the critic only
    with one, the actor not during trainer.critic_warmup), their metrics into `metrics` -> (the
    actor's weights version after its update, None when it did not update; the old log-probs as
    its update used them)."""
    actor = _update_actor(ctx, phase2, gen, adv, metrics) if step > ctx.cfg.trainer.critic_warmup else None
    actor_out, critic_metrics = await asyncio.gather(
        maybe(actor), timed_await(_update_critic(ctx, phase2, adv) if ctx.use_critic else None, metrics,
                                  M.TIMING_UPDATE_CRITIC))
    metrics.update(critic_metrics or {})
    if actor_out is None:
        return None, None
    actor_metrics, version, old = actor_out
    metrics.update(actor_metrics)
    return version, old


async def _update_actor(ctx: StepContext, phase2: Phase2, gen: DataProto, adv: Advantages, timings: dict):
    """The actor's update -> (metrics, weights version, old log-probs as it used them). On kept rows
    it leaves at once and runs behind the actor's own pass; on rows sent it carries that pass's
    log-probs. Its timing starts when the actor can start it (the pass done)."""
    actor = ctx.cfg.actor_rollout_ref.actor
    send = DataProto(tensors={"advantages": adv.advantages.float()})
    if actor.tis_imp_ratio_cap > 0:
        send.tensors["rollout_log_probs"] = gen["rollout_log_probs"]
    rows = phase2.rows()
    if not phase2.kept:
        lp = await phase2.result()
        send.tensors["old_log_probs"] = lp.old["old_log_probs"]
        if actor.use_kl_loss:
            send.tensors["ref_log_prob"] = lp.ref["ref_log_prob"]
    t_sent = time.perf_counter()
    update = asyncio.ensure_future(ctx.roles.actor.update_actor(rows, send))
    try:
        await phase2.result()
    except BaseException:
        update.cancel()
        raise
    t_start = max(t_sent, time.perf_counter())
    metrics, version, old, _ = await update
    timings[M.TIMING_UPDATE_ACTOR] = time.perf_counter() - t_start
    return metrics, version, old


async def _update_critic(ctx: StepContext, phase2: Phase2, adv: Advantages) -> dict:
    lp = await phase2.result()
    critic = phase2.sequences().select(tensor_keys=SEQ_KEYS)
    critic.tensors.update(values=lp.values["values"], returns=adv.returns.float())
    return await ctx.roles.critic.update_critic(critic)
