"""One PPO / GRPO step (DESIGN section 1) as the controller sequences it, in four phases:

1. rollout and scoring: n samples per prompt, scored by the reward service (ReMax: also a
   greedy baseline per prompt; DAPO: generation rounds until enough prompt groups with
   varied rewards are kept, controller/dapo.py);
2. log-probs and values: old and reference log-probs (in one actor call: trainer.log_probs_one_call)
   and the critic's values, concurrently;
   the rows the update trains on the current weights (every row of one mini-batch, else the
   first mini-batch's; one epoch, no KL in the reward) take the update's own forward's old
   log-probs (bit-identical, TRL does the same), which come back in phase 4;
3. advantages: KL to the reference in the reward (optional), then the configured estimator;
4. update: actor and critic concurrently, then the new weights to a standalone rollout.

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
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext

import torch

from tandem.algos import advantages as adv_algos
from tandem.algos import kl as kl_algos
from tandem.algos import metrics as M
from tandem.config import TandemConfig
from tandem.controller import scoring
from tandem.controller.dapo import collect_varied_groups
from tandem.controller.reward_calls import RowScores, settle
from tandem.controller.roles import Roles
from tandem.controller.step_context import Advantages, LogProbs, StepContext
from tandem.controller.step_metrics import data_metrics, perf_metrics
from tandem.data.batch import DataProto
from tandem.logging import get_logger
from tandem.rollout.outputs import SEQ_KEYS, step_rows
from tandem.rpc.errors import FailedPrecondition, InvalidArgument
from tandem.v1 import rollout_pb2

_log = get_logger("controller.step")

Prompts = DataProto | Callable[[int], DataProto]  # a batch, or k -> the next k prompts


@contextmanager
def timed(metrics: dict, key: str):
    """Add the block's wall-clock seconds to metrics[key] (a phase run several times adds up)."""
    t0 = time.perf_counter()
    yield
    metrics[key] = metrics.get(key, 0.0) + time.perf_counter() - t0


async def _timed(coro, metrics: dict, key: str):
    """Await `coro` (None: nothing), timing it as metrics[key]."""
    if coro is None:
        return None
    with timed(metrics, key):
        return await coro


async def _maybe(coro):
    return await coro if coro is not None else None


async def ppo_step(ctx: StepContext, prompts: Prompts, step: int) -> dict[str, float]:
    """One step -> its metrics. `prompts` is a batch, or a function k -> the next k prompts
    (DAPO dynamic sampling may take several batches in one step)."""
    metrics: dict[str, float] = {}
    t_step = time.perf_counter()
    t = ctx.cfg.trainer
    on = (t.log_probs_with_scoring or after_generation(ctx)) and not ctx.cfg.algorithm.filter_groups.enable
    early = EarlyLogProbs(ctx, step, metrics) if on else None
    try:
        gen, sampling_metrics = await rollout_and_score(ctx, prompts, step, metrics, early)
    except BaseException:
        if early is not None and early.task is not None:
            early.task.cancel()  # the step fails: its log-probs are not waited for
        raise
    metrics.update(sampling_metrics)
    lp = await early.result(gen) if early is not None else None
    if nothing_to_train(gen, step, metrics):
        metrics[M.TIMING_STEP] = time.perf_counter() - t_step
        return metrics
    version = await train_on(ctx, gen, step, metrics, early=lp)
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


def after_generation(ctx: StepContext) -> bool:
    """trainer.log_probs_after_generation where it applies: the rollout is the actor's own (colocated)."""
    return ctx.cfg.trainer.log_probs_after_generation and not ctx.roles.standalone_rollout


def on_policy_step(ctx: StepContext, rows: int, step: int) -> int:
    """Leading rows whose old log-probs the update's own forward gives (none while the critic warms up)."""
    return ctx.on_policy_rows(rows) if step > ctx.cfg.trainer.critic_warmup else 0


class EarlyLogProbs:
    """trainer.log_probs_with_scoring: phase 2 starts when the rows are generated, while they are
    scored (it does not need the scores); rows scoring drops (reward_model.on_failure=drop) leave
    its results too. Not with DAPO's dynamic sampling (its rows are known after several rounds).
    trainer.log_probs_after_generation (colocated): the actor's pass is queued behind the
    generation itself (`queue_after`) and phase 2 asks for its result (the kept rows)."""

    ROW = "__generated_row__"  # each generated row's number, through scoring's row selection

    def __init__(self, ctx: StepContext, step: int, metrics: dict[str, float]):
        self.ctx, self.step, self.metrics = ctx, step, metrics
        self.task: asyncio.Task | None = None
        self.generated = 0

    def queue_after(self, rows: int) -> rollout_pb2.LogProbsAfter | None:
        """GenerateSequences' log_probs_after for `rows` generated rows: phase 2's actor call as one
        ComputeLogProb (an old pass, the reference's with it; or the reference's alone when the
        update gives every old log-prob); None when phase 2 makes two actor calls or none."""
        ctx = self.ctx
        own = on_policy_step(ctx, rows, self.step)
        if not after_generation(ctx) or (own < rows and ctx.need_ref and not ctx.cfg.trainer.log_probs_one_call):
            return None
        if own >= rows and not ctx.need_ref:
            return None
        return rollout_pb2.LogProbsAfter(with_reference=ctx.need_ref, policy_from_row=min(own, rows))

    def start(self, gen: DataProto) -> None:
        kept = gen.meta.pop("kept_rows", "")
        if not kept and not self.ctx.cfg.trainer.log_probs_with_scoring:
            return  # nothing was queued: phase 2 runs after scoring (result() is None)
        # fewer rows later: rows computed by the update stay among the first `own` (scoring keeps the order)
        own = on_policy_step(self.ctx, len(gen), self.step)
        self.task = asyncio.ensure_future(log_probs_and_values(self.ctx, sequences(gen, self.ctx.cfg), self.metrics,
                                                               own=own, kept=kept))
        self.generated = len(gen)
        gen.tensors[self.ROW] = torch.arange(len(gen))

    async def result(self, gen: DataProto) -> LogProbs | None:
        """Phase 2's results for the rows of `gen` that scoring kept (and `gen` without the row
        numbers); None when it was not started early."""
        if self.task is None:
            return None
        lp, rows = await self.task, gen.tensors.pop(self.ROW)
        if len(rows) != self.generated:  # scoring dropped rows (keeping the others' order)
            lp = LogProbs(*(None if x is None else x.index(rows) for x in (lp.old, lp.ref, lp.values)), own=lp.own)
        return lp


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
    return step_rows(gen, cfg.actor_rollout_ref.rollout.temperature, cfg.actor_rollout_ref.rollout.n)


# ---- phase 2: log-probs and values ----------------------------------------------------------

async def log_probs_and_values(ctx: StepContext, seq: DataProto, timings: dict | None = None,
                               own: int = 0, kept: str = "") -> LogProbs:
    """Old log-probs (but those of the first `own` rows: the update computes them; every row's:
    no pass), reference log-probs and values, concurrently (each timed on its own);
    trainer.log_probs_one_call: old and reference in one actor call (both timings are that call's).
    kept: the actor holds these rows (a generation's kept_rows) and its ComputeLogProb pass on them."""
    actor, critic, timings = ctx.roles.actor, ctx.roles.critic, {} if timings is None else timings
    old_pass = own < len(seq)
    if old_pass and ctx.need_ref and ctx.cfg.trainer.log_probs_one_call:  # one call: both timings are its own
        t0 = time.perf_counter()
        both, values = await asyncio.gather(
            _actor_log_prob(actor, seq, kept, with_reference=True, policy_from_row=own),
            _timed(critic.compute_values(seq) if ctx.use_critic else None, timings, M.TIMING_VALUES))
        for key in (M.TIMING_OLD_LOG_PROB, M.TIMING_REF):
            timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
        if "ref_log_prob" not in both.tensors:  # proto3 drops a field the service does not know
            raise RuntimeError("the actor service returned no ref_log_prob for ComputeLogProb with_reference: it "
                               "predates that field; restart it on this version or set trainer.log_probs_one_call=false")
        ref = DataProto(tensors={"ref_log_prob": both.tensors.pop("ref_log_prob")})
        return LogProbs(both, ref, values, own)
    old, ref, values = await asyncio.gather(
        _timed(_actor_log_prob(actor, seq, kept, policy_from_row=own) if old_pass else None, timings,
               M.TIMING_OLD_LOG_PROB),
        _timed(_reference_log_prob(actor, seq, kept) if ctx.need_ref else None, timings, M.TIMING_REF),
        _timed(critic.compute_values(seq) if ctx.use_critic else None, timings, M.TIMING_VALUES))
    return LogProbs(old, ref, values, own if old_pass else 0)


async def _actor_log_prob(actor, seq: DataProto, kept: str, **settings) -> DataProto:
    """ComputeLogProb on the kept rows when the actor holds them (its pass may be done already), else on `seq`."""
    if kept:
        try:
            return await actor.kept_log_prob(kept, **settings)
        except FailedPrecondition as e:  # e.g. the actor restarted since the generation: send the rows
            _log.warning("log_probs.kept_rows_gone", reason=str(e))
    return await actor.compute_log_prob(seq, **settings)


async def _reference_log_prob(actor, seq: DataProto, kept: str) -> DataProto:
    """ComputeRefLogProb's answer; from the kept rows' pass (the reference's alone) when there is one."""
    if kept:
        both = await _actor_log_prob(actor, seq, kept, with_reference=True, policy_from_row=len(seq))
        return DataProto(tensors={"ref_log_prob": both["ref_log_prob"]})
    return await actor.compute_ref_log_prob(seq)


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
        _timed(actor_call, timings, M.TIMING_UPDATE_ACTOR),
        _timed(roles.critic.update_critic(critic_batch) if critic_batch is not None else None, timings,
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
