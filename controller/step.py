"""One PPO / GRPO step (DESIGN §1), as the controller sequences it.

generate -> {reward, old log-probs, ref log-probs, values} concurrently -> KL and
advantages here -> {critic update, actor update} concurrently -> weights to a
standalone rollout -> metrics.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from tandem.algos import advantages as adv_algos, kl as kl_algos, metrics as M
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


async def ppo_step(roles: Roles, prompts: DataProto, cfg: TandemConfig, kl_ctrl, tokenizer,
                   step: int) -> dict[str, float]:
    a, alg = cfg.actor_rollout_ref, cfg.algorithm
    n = a.rollout.n
    metrics: dict[str, float] = {}
    t_step = time.perf_counter()
    use_critic = alg.adv_estimator == "gae"
    need_ref = a.actor.use_kl_loss or alg.use_kl_in_reward

    with timed(metrics, "gen"):
        gen = await roles.rollout.generate_sequences(
            prompts, max_new_tokens=cfg.data.max_response_length, n=n,
            temperature=a.rollout.temperature, top_p=a.rollout.top_p, top_k=a.rollout.top_k,
            seed=cfg.trainer.seed * 1_000_003 + step)
    seq = gen.select(tensor_keys=SEQ_KEYS)
    seq.meta = {"temperature": a.rollout.temperature, "rollout_n": n}
    mask = gen["response_mask"].float()

    t0 = time.perf_counter()
    scores, old, ref, values = await asyncio.gather(
        score(roles.reward, gen, tokenizer),
        roles.actor.compute_log_prob(seq),
        _maybe(roles.actor.compute_ref_log_prob(seq) if need_ref else None),
        _maybe(roles.critic.compute_values(seq) if use_critic else None))
    metrics["timing_s/reward_logprob_values"] = time.perf_counter() - t0

    with timed(metrics, "adv"):
        token_scores = token_level(scores, mask)
        rewards = token_scores
        if alg.use_kl_in_reward:
            rewards, kl_metrics = kl_algos.apply_kl_penalty(
                token_scores, old["old_log_probs"], ref["ref_log_prob"], mask, kl_ctrl, alg.kl_penalty)
            kl_ctrl.update(kl_metrics["actor/reward_kl_penalty"], n_steps=len(prompts))
            metrics.update(kl_metrics)
        # every estimator gets what it takes of these (group ids: rows are prompt-major)
        advantages, returns = adv_algos.compute_advantage(
            alg.adv_estimator, token_level_rewards=rewards, response_mask=mask,
            values=values["values"] if use_critic else None, index=torch.arange(len(gen)) // n,
            gamma=alg.gamma, lam=alg.lam, norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo)

    train = seq.union(old.select(tensor_keys=["old_log_probs"]))
    train.tensors["advantages"] = advantages.float()
    if a.actor.use_kl_loss:
        train.tensors["ref_log_prob"] = ref["ref_log_prob"]
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
        with timed(metrics, "sync_weights"):
            weights, version = await roles.actor.export_weights()
            await roles.rollout.load_weights(weights, version)

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
