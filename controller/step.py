"""One PPO / GRPO step (DESIGN section 1) as the controller sequences it, in four phases:

1. rollout and scoring: n samples per prompt, scored by the reward service (ReMax: also a
   greedy baseline per prompt; DAPO: generation rounds until enough prompt groups with
   varied rewards are kept, controller/dapo.py);
2. log-probs and values: old and reference log-probs (in one actor call: trainer.log_probs_one_call)
   and the critic's values, concurrently;
   the rows the update trains on the current weights (every row of one mini-batch, else the
   first mini-batch's; one epoch, no KL in the reward) take the update's own forward's old
   log-probs (bit-identical, TRL does the same), which come back in phase 4 (controller/log_probs.py);
3. advantages: KL to the reference in the reward (optional), then the configured estimator;
4. update: actor and critic concurrently, then the new weights to a standalone rollout.

With a colocated rollout (trainer.log_probs_after_generation) the actor queues phase 2's pass
behind the generation and keeps the rows; when the advantages need no log-probs or values
(GRPO-like, no KL in the reward) phase 4's update leaves right after scoring, before phase 2's
results are back, and the actor runs it behind that pass (train_on_kept): the GPU does not wait
for the controller between generation, log-probs and update.

Timings carry verl's names (`timing_s/{gen,reward,old_log_prob,ref,values,adv,update_critic,
update_actor,update_weights,step}`); the calls of a phase that run concurrently (old log-probs,
reference and values; actor and critic updates) are each timed on their own, so they overlap.
Then verl's data metrics and `perf/{total_num_tokens,time_per_step,throughput}` (controller/step_metrics.py).

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
from tandem.controller.log_probs import EarlyLogProbs, after_generation, log_probs_and_values, on_policy_step, sequences
from tandem.controller.reward_calls import RowScores, settle
from tandem.controller.roles import Roles
from tandem.controller.step_context import Advantages, LogProbs, StepContext
from tandem.controller.step_metrics import data_metrics, perf_metrics
from tandem.controller.step_timing import maybe, timed, timed_await
from tandem.data.batch import DataProto
from tandem.logging import get_logger
from tandem.rollout.outputs import SEQ_KEYS
from tandem.rpc.errors import FailedPrecondition, InvalidArgument

_log = get_logger("controller.step")

Prompts = DataProto | Callable[[int], DataProto]  # a batch, or k -> the next k prompts


async def ppo_step(ctx: StepContext, prompts: Prompts, step: int) -> dict[str, float]:
    """One step -> its metrics. `prompts` is a batch, or a function k -> the next k prompts
    (DAPO dynamic sampling may take several batches in one step)."""
    metrics: dict[str, float] = {}
    t_step = time.perf_counter()
    early_on = ctx.cfg.trainer.log_probs_with_scoring or after_generation(ctx)
    on = early_on and not ctx.cfg.algorithm.filter_groups.enable
    early = EarlyLogProbs(ctx, step, metrics) if on else None
    try:
        gen, sampling_metrics = await rollout_and_score(ctx, prompts, step, metrics, early)
    except BaseException:
        if early is not None and early.task is not None:
            early.task.cancel()  # the step fails: its log-probs are not waited for
        raise
    metrics.update(sampling_metrics)
    kept = bool(len(gen) and early is not None and early.kept and update_from_kept(ctx, step))
    lp = await early.result(gen) if early is not None and not kept else None
    if nothing_to_train(gen, step, metrics):
        metrics[M.TIMING_STEP] = time.perf_counter() - t_step
        return metrics
    version = await (train_on_kept(ctx, gen, step, metrics, early) if kept else train_on(ctx, gen, step, metrics,
                                                                                         early=lp))
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
                   early: LogProbs | None = None) -> int | None:
    """Phases 2-4 on a scored batch with rows, its metrics added to `metrics` -> the actor's weights
    version after its update (None: the actor did not update, trainer.critic_warmup). `update_guard`
    is held around the update (the asynchronous loop keeps weight syncs out of it). `early`: phase
    2's results, computed while the batch was scored."""
    metrics.update(scoring.reward_metrics(gen, ctx.cfg))
    seq = sequences(gen, ctx.cfg)
    lp = early
    if lp is None:
        lp = await log_probs_and_values(ctx, seq, metrics, own=on_policy_step(ctx, len(seq), step))
    with timed(metrics, M.TIMING_ADV):
        adv, kl_metrics = compute_advantages(ctx, gen, lp)
        metrics.update(kl_metrics)
    actor_batch, critic_batch = update_batches(ctx, seq, gen, lp, adv)
    if step <= ctx.cfg.trainer.critic_warmup:  # verl: the critic learns first, the policy waits
        actor_batch = None
    async with update_guard or nullcontext():
        update_metrics, version = await update_actor_critic(ctx.roles, actor_batch, critic_batch, lp, metrics)
    metrics.update(M.rollout_probs_diff(gen["rollout_log_probs"], lp.old["old_log_probs"], adv.mask))
    metrics.update(update_metrics)
    metrics.update(data_metrics(ctx, gen, lp, adv))
    return version


def update_from_kept(ctx: StepContext, step: int) -> bool:
    """The actor's update can leave before phase 2's results are back: the advantages need no
    log-probs or values (no critic, no KL in the reward) and the actor trains this step."""
    return not ctx.use_critic and not ctx.cfg.algorithm.use_kl_in_reward and step > ctx.cfg.trainer.critic_warmup


async def train_on_kept(ctx: StepContext, gen: DataProto, step: int, metrics: dict[str, float],
                        early: EarlyLogProbs) -> int | None:
    """train_on when the actor keeps the rows and the log-prob pass queued behind their generation
    (trainer.log_probs_after_generation) and update_from_kept: the update leaves right after
    scoring with the advantages and the kept rows' numbers only, and the actor runs it behind that
    pass (no GPU gap for the round trip); phase 2's results come back meanwhile, for the metrics.
    The actor no longer holding the rows (FailedPrecondition): train_on."""
    metrics.update(scoring.reward_metrics(gen, ctx.cfg))
    with timed(metrics, M.TIMING_ADV):
        adv, _ = compute_advantages(ctx, gen, LogProbs(None, None, None))
    send = DataProto(tensors={"kept_row": gen[EarlyLogProbs.ROW], "advantages": adv.advantages.float()})
    if ctx.cfg.actor_rollout_ref.actor.tis_imp_ratio_cap > 0:
        send.tensors["rollout_log_probs"] = gen["rollout_log_probs"]
    whole, t0 = early.own >= len(gen), time.perf_counter()
    update = asyncio.ensure_future(ctx.roles.actor.update_actor_kept(
        early.kept, send, on_policy=early.own > 0, rows=0 if whole else early.own))
    try:
        lp = await early.result(gen)
    except BaseException:
        update.cancel()
        raise
    t_lp = time.perf_counter()
    try:
        update_metrics, version, old = await update
    except FailedPrecondition as e:  # e.g. the actor restarted: the rows go with the update
        _log.warning("update.kept_rows_gone", reason=str(e))
        return await train_on(ctx, gen, step, metrics, early=lp)
    metrics[M.TIMING_UPDATE_ACTOR] = time.perf_counter() - max(t0, t_lp)  # its own: it ran behind the pass
    if old is not None:  # on-policy rows: the update's own old log-probs
        lp.old, lp.own = old, 0
    metrics.update(M.rollout_probs_diff(gen["rollout_log_probs"], lp.old["old_log_probs"], adv.mask))
    metrics.update(update_metrics)
    metrics.update(data_metrics(ctx, gen, lp, adv))
    return version


# ---- phase 1: rollout and scoring -----------------------------------------------------------

async def rollout_and_score(ctx: StepContext, prompts: Prompts, step: int, timings: dict | None = None,
                            early: EarlyLogProbs | None = None) -> tuple[DataProto, dict[str, float]]:
    """The step's scored generations, and DAPO's counts when dynamic sampling is on (`timings`
    gets timing_s/gen and timing_s/reward, summed over DAPO's rounds). `early`: started on the
    generated rows before they are scored."""
    cfg, timings = ctx.cfg, {} if timings is None else timings
    seed = cfg.trainer.seed * 1_000_003 + step
    if cfg.algorithm.filter_groups.enable:
        return await collect_varied_groups(lambda batch, i: generate_and_score(ctx, batch, seed + 7919 * i, timings),
                                           prompts, cfg, ctx.tokenizer.pad_token_id)
    batch = prompts(cfg.data.train_batch_size) if callable(prompts) else prompts
    return await generate_and_score(ctx, batch, seed, timings, early), {}


async def generate_and_score(ctx: StepContext, prompts: DataProto, seed: int, timings: dict | None = None,
                             early: EarlyLogProbs | None = None) -> DataProto:
    """n samples per prompt (rows prompt-major), scored. Adds per-row tensors `acc` (the
    verifier's score), `seq_reward` (acc + overlong penalty) and, for ReMax,
    `reward_baselines` (the shaped score of a greedy response to the same prompt). Rows that
    could not be scored fail the step or leave with their prompt group
    (reward_model.on_failure, controller/reward_calls.py); meta `reward_failed_rows` counts them."""
    roles, cfg, tokenizer, timings = ctx.roles, ctx.cfg, ctx.tokenizer, {} if timings is None else timings
    r, max_new = cfg.actor_rollout_ref.rollout, cfg.data.max_response_length
    with timed(timings, M.TIMING_GEN):
        gen = await roles.rollout.generate_sequences(
            prompts, max_new_tokens=max_new, n=r.n, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
            seed=seed, **({"log_probs_after": early.queue_after(len(prompts) * r.n)} if early is not None else {}))
    if early is not None:
        early.start(gen)

    async def greedy_baseline() -> tuple[RowScores, torch.Tensor]:
        base = await roles.rollout.generate_sequences(prompts, max_new_tokens=max_new, n=1, greedy=True)
        scored = await scoring.score(roles.reward, base, tokenizer, cfg)
        return scored, scoring.shaped_scores(scored.scores, base["response_mask"], cfg)

    remax = cfg.algorithm.adv_estimator == "remax"
    with timed(timings, M.TIMING_REWARD):  # ReMax's greedy baseline rollout is scored meanwhile
        scored, baseline = await asyncio.gather(scoring.score(roles.reward, gen, tokenizer, cfg),
                                                maybe(greedy_baseline() if remax else None))
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
    check_finite({"seq_reward (the reward service's scores)": gen["seq_reward"],
                  # on-policy: no old log-probs yet (the update's own forward gives them)
                  **({"old_log_probs (the actor)": lp.old["old_log_probs"]} if lp.old is not None else {}),
                  **({"ref_log_prob (the actor's reference)": lp.ref["ref_log_prob"]} if lp.ref is not None else {}),
                  **({"values (the critic)": lp.values["values"]} if lp.values is not None else {}),
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


# ---- phase 4: update ------------------------------------------------------------------------

def update_batches(ctx: StepContext, seq: DataProto, gen: DataProto, lp: LogProbs,
                   adv: Advantages) -> tuple[DataProto, DataProto | None]:
    """-> (the actor's update batch, the critic's or None without a critic)."""
    actor = ctx.cfg.actor_rollout_ref.actor
    old = lp.old.select(tensor_keys=["old_log_probs"]) if lp.old is not None else DataProto()  # None: on-policy
    train = seq.union(old)
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


async def update_actor_critic(roles: Roles, actor_batch: DataProto | None, critic_batch: DataProto | None,
                              lp: LogProbs, timings: dict | None = None) -> tuple[dict[str, float], int | None]:
    """The actor's and the critic's updates, concurrently (each timed on its own); a None batch: no
    update of that role (no critic, or trainer.critic_warmup) -> (their metrics, the actor's
    weights version after its update, None when it did not update). An on-policy actor update
    (lp.old is None, or its first lp.own rows) fills in lp.old with the old log-probs it used."""
    timings = {} if timings is None else timings
    if actor_batch is None:
        actor_call = None
    elif lp.old is None or lp.own >= len(actor_batch):  # every row's old log-probs are the update's
        actor_call = roles.actor.update_actor_on_policy(
            actor_batch.select(tensor_keys=[k for k in actor_batch.tensors if k != "old_log_probs"]))
    elif lp.own:
        actor_call = _first_mini_batch_on_policy(roles.actor, actor_batch, lp.own)
    else:
        actor_call = roles.actor.update_actor(actor_batch)
    actor_out, critic_metrics = await asyncio.gather(
        timed_await(actor_call, timings, M.TIMING_UPDATE_ACTOR),
        timed_await(roles.critic.update_critic(critic_batch) if critic_batch is not None else None, timings,
                    M.TIMING_UPDATE_CRITIC))
    if not actor_out:
        return dict(critic_metrics or {}), None
    if lp.old is None or lp.own:
        lp.old, lp.own = actor_out[2], 0
    return {**actor_out[0], **(critic_metrics or {})}, actor_out[1]


async def _first_mini_batch_on_policy(actor, batch: DataProto, rows: int):
    try:
        return await actor.update_actor_on_policy(batch, rows=rows)
    except InvalidArgument as e:  # a service older than on_policy_rows reads on_policy alone: refused, unchanged
        if "the batch carries old_log_probs" not in str(e):
            raise
        raise RuntimeError("the actor service refused UpdateActor's on_policy_rows: it predates that field (nothing was "
                           "updated); restart it on this version or set trainer.old_log_probs_from_update=false") from e
