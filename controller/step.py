"""One PPO / GRPO step (DESIGN §1), as the controller sequences it.

generate + score (ReMax: also a greedy baseline; DAPO: overlong shaping, and dynamic
sampling in controller/dapo.py) -> {old log-probs, ref log-probs, values} concurrently
-> KL and advantages here -> {critic update, actor update} concurrently -> weights to a
standalone rollout -> metrics.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from tandem.algos import advantages as adv_algos
from tandem.algos import dapo as dapo_algos
from tandem.algos import kl as kl_algos
from tandem.algos import metrics as M
from tandem.config import TandemConfig
from tandem.data.batch import DataProto

SEQ_KEYS = ["input_ids", "attention_mask", "responses", "response_mask"]


@dataclass
class Roles:
    actor: object
    rollout: object
    reward: object
    critic: object | None = None
    standalone_rollout: bool = False


@contextmanager
def timed(metrics: dict, name: str):
    t0 = time.perf_counter()
    yield
    metrics[f"timing_s/{name}"] = time.perf_counter() - t0


def decode_responses(gen: DataProto, tokenizer) -> list[str]:
    rows = [r[m.bool()].tolist() for r, m in zip(gen["responses"], gen["response_mask"])]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


async def score(reward, gen: DataProto, tokenizer) -> torch.Tensor:
    batch = DataProto(columns={"response_text": decode_responses(gen, tokenizer),
                               "ground_truth": gen["ground_truth"], "data_source": gen["data_source"]})
    return torch.tensor(await reward.score(batch), dtype=torch.float32)


def token_level(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Outcome reward on each row's last response token: [B] -> [B, R]."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.sum(-1) - 1).clamp(min=0).long()
    out[torch.arange(len(scores)), last] = scores
    return out


async def _maybe(coro):
    return await coro if coro is not None else None


def shaped_scores(scores: torch.Tensor, response_mask: torch.Tensor, cfg: TandemConfig) -> torch.Tensor:
    """Scores plus DAPO's overlong penalty when reward_model.overlong_buffer is enabled."""
    ob = cfg.reward_model.overlong_buffer
    if not ob.enable:
        return scores
    return scores + dapo_algos.compute_overlong_penalty(
        response_mask.sum(-1), cfg.data.max_response_length, ob.len, ob.penalty_factor)


async def generate_and_score(roles: Roles, prompts: DataProto, cfg: TandemConfig, tokenizer,
                             seed: int) -> DataProto:
    """n samples per prompt (rows prompt-major), scored. Adds per-row tensors `acc` (the
    verifier's score), `seq_reward` (acc + overlong penalty) and, for ReMax,
    `reward_baselines` (the shaped score of a greedy response to the same prompt)."""
    a = cfg.actor_rollout_ref
    n, max_new = a.rollout.n, cfg.data.max_response_length
    gen = await roles.rollout.generate_sequences(
        prompts, max_new_tokens=max_new, n=n, temperature=a.rollout.temperature,
        top_p=a.rollout.top_p, top_k=a.rollout.top_k, seed=seed)

    async def greedy_baseline() -> torch.Tensor:
        base = await roles.rollout.generate_sequences(prompts, max_new_tokens=max_new, n=1, greedy=True)
        return shaped_scores(await score(roles.reward, base, tokenizer), base["response_mask"], cfg)

    remax = cfg.algorithm.adv_estimator == "remax"
    scores, baselines = await asyncio.gather(score(roles.reward, gen, tokenizer),
                                             _maybe(greedy_baseline() if remax else None))
    gen.tensors["acc"] = scores
    gen.tensors["seq_reward"] = shaped_scores(scores, gen["response_mask"], cfg)
    if remax:
        gen.tensors["reward_baselines"] = baselines.repeat_interleave(n)
    return gen


def reward_metrics(gen: DataProto, cfg: TandemConfig) -> dict[str, float]:
    out = {}
    if cfg.reward_model.overlong_buffer.enable:
        penalty = gen["seq_reward"] - gen["acc"]
        out[M.CRITIC_OVERLONG_REWARD_MEAN] = float(penalty.mean())
        out[M.CRITIC_OVERLONG_FRAC] = float((penalty < 0).float().mean())
    if "reward_baselines" in gen.tensors:
        out[M.REWARD_BASELINE_MEAN] = float(gen["reward_baselines"].mean())
    return out


async def ppo_step(roles: Roles, prompts: DataProto | Callable[[int], DataProto], cfg: TandemConfig,
                   kl_ctrl, tokenizer, step: int) -> dict[str, float]:
    """One step. `prompts` is a batch, or a function k -> the next k prompts (needed by
    DAPO dynamic sampling, which may generate several batches per step)."""
    from controller.dapo import collect_varied_groups
    from controller.weight_sync import sync_weights

    a, alg = cfg.actor_rollout_ref, cfg.algorithm
    n = a.rollout.n
    metrics: dict[str, float] = {}
    t_step = time.perf_counter()
    use_critic = alg.adv_estimator == "gae"
    need_ref = a.actor.use_kl_loss or alg.use_kl_in_reward
    seed = cfg.trainer.seed * 1_000_003 + step

    with timed(metrics, "gen"):
        if alg.filter_groups.enable:
            gen, dapo_metrics = await collect_varied_groups(
                lambda batch, i: generate_and_score(roles, batch, cfg, tokenizer, seed + 7919 * i),
                prompts, cfg, tokenizer.pad_token_id)
            metrics.update(dapo_metrics)
        else:
            batch = prompts(cfg.data.train_batch_size) if callable(prompts) else prompts
            gen = await generate_and_score(roles, batch, cfg, tokenizer, seed)
    metrics.update(reward_metrics(gen, cfg))
    seq = gen.select(tensor_keys=SEQ_KEYS)
    seq.meta = {"temperature": a.rollout.temperature, "rollout_n": n}
    mask = gen["response_mask"].float()

    t0 = time.perf_counter()
    old, ref, values = await asyncio.gather(
        roles.actor.compute_log_prob(seq),
        _maybe(roles.actor.compute_ref_log_prob(seq) if need_ref else None),
        _maybe(roles.critic.compute_values(seq) if use_critic else None))
    metrics["timing_s/reward_logprob_values"] = time.perf_counter() - t0

    with timed(metrics, "adv"):
        token_scores = token_level(gen["seq_reward"], mask)
        rewards = token_scores
        if alg.use_kl_in_reward:
            rewards, kl_metrics = kl_algos.apply_kl_penalty(
                token_scores, old["old_log_probs"], ref["ref_log_prob"], mask, kl_ctrl, alg.kl_penalty)
            kl_ctrl.update(kl_metrics["actor/reward_kl_penalty"], n_steps=len(gen) // n)
            metrics.update(kl_metrics)
        # every estimator gets what it takes of these (group ids: rows are prompt-major)
        advantages, returns = adv_algos.compute_advantage(
            alg.adv_estimator, token_level_rewards=rewards, response_mask=mask,
            values=values["values"] if use_critic else None, index=torch.arange(len(gen)) // n,
            reward_baselines=gen.tensors.get("reward_baselines"),
            gamma=alg.gamma, lam=alg.lam, norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)

    metrics.update(M.rollout_probs_diff(gen["rollout_log_probs"], old["old_log_probs"], mask))
    train = seq.union(old.select(tensor_keys=["old_log_probs"]))
    train.tensors["advantages"] = advantages.float()
    if a.actor.use_kl_loss:
        train.tensors["ref_log_prob"] = ref["ref_log_prob"]
    if a.actor.tis_imp_ratio_cap > 0:
        train.tensors["rollout_log_probs"] = gen["rollout_log_probs"]
    critic_batch = None
    if use_critic:
        critic_batch = seq.select(tensor_keys=SEQ_KEYS)
        critic_batch.meta = dict(seq.meta)
        critic_batch.tensors.update(values=values["values"], returns=returns.float())

    t0 = time.perf_counter()
    (actor_metrics, version), critic_metrics = await asyncio.gather(
        roles.actor.update_actor(train),
        _maybe(roles.critic.update_critic(critic_batch) if use_critic else None))
    metrics["timing_s/update_actor_critic"] = time.perf_counter() - t0
    metrics.update(actor_metrics)
    metrics.update(critic_metrics or {})

    if roles.standalone_rollout:
        metrics.update(await sync_weights(roles.actor, roles.rollout, version))

    tensors = {"token_level_scores": token_scores, "token_level_rewards": rewards,
               "advantages": advantages, "returns": returns, "response_mask": mask,
               "prompt_mask": gen["attention_mask"][:, : gen["prompts"].shape[1]].float()}
    if use_critic:
        tensors["values"] = values["values"]
    metrics.update(M.compute_data_metrics(tensors, use_critic=use_critic,
                                          max_response_length=cfg.data.max_response_length))
    metrics["timing_s/step"] = time.perf_counter() - t_step
    tokens = float(gen["attention_mask"].sum())
    metrics["perf/total_num_tokens"] = tokens
    metrics["perf/throughput"] = tokens / metrics["timing_s/step"]
    return metrics
