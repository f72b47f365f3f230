"""Per-micro-batch losses of the actor (PPO, SFT) and critic on a megatron GPTModel.

Batches use verl's column names: input_ids / attention_mask [B, T] hold
[left-padded prompt | right-padded response]; responses / response_mask [B, R].
"""
from __future__ import annotations

import torch

from tandem.algos import aggregate, losses as algo_losses
from tandem.algos import metrics as M
from tandem.config import ActorConfig, CriticConfig
from tandem.data.batch import DataProto
from tandem.dist import device
from tandem.models.forward import forward_logits, response_slice
from tandem.models.logprobs import entropy_from_logits, log_probs_from_logits


def _inputs(mb: DataProto):
    dev = device.device()
    return mb["input_ids"].to(dev), mb["attention_mask"].to(dev), mb["responses"].to(dev)


def response_log_probs(model, mb: DataProto, temperature: float, with_entropy: bool):
    """-> (log_probs [B, R], entropy [B, R] or None) of the response tokens."""
    input_ids, attention_mask, responses = _inputs(mb)
    logits = response_slice(forward_logits(model, input_ids, attention_mask), responses.shape[1])
    entropy = entropy_from_logits(logits, temperature) if with_entropy else None
    return log_probs_from_logits(logits, responses, temperature), entropy


def ppo_actor_loss(model, mb: DataProto, cfg: ActorConfig, temperature: float):
    """PPO clipped loss (+ entropy bonus, + KL loss) of one micro-batch -> (loss, metrics)."""
    dev = device.device()
    mask = mb["response_mask"].to(dev).float()
    log_prob, entropy = response_log_probs(model, mb, temperature, with_entropy=True)
    common = dict(old_log_prob=mb["old_log_probs"].to(dev), log_prob=log_prob,
                  advantages=mb["advantages"].to(dev), response_mask=mask, loss_agg_mode=cfg.loss_agg_mode)
    if cfg.policy_loss.loss_mode == "gspo":  # sequence-level ratio; clip bounds default to clip_ratio
        pg_loss, clipfrac, ppo_kl, clipfrac_lower = algo_losses.compute_gspo_policy_loss(
            clip_ratio_low=cfg.clip_ratio_low if cfg.clip_ratio_low is not None else cfg.clip_ratio,
            clip_ratio_high=cfg.clip_ratio_high if cfg.clip_ratio_high is not None else cfg.clip_ratio,
            **common)
    else:
        pg_loss, clipfrac, ppo_kl, clipfrac_lower = algo_losses.compute_policy_loss(
            clip_ratio=cfg.clip_ratio, clip_ratio_low=cfg.clip_ratio_low,
            clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c, **common)
    entropy_mean = aggregate.agg_loss(entropy, mask, cfg.loss_agg_mode)
    loss = pg_loss - cfg.entropy_coeff * entropy_mean
    metrics = {M.ACTOR_PG_LOSS: pg_loss.item(), M.ACTOR_PG_CLIPFRAC: clipfrac.item(),
               M.ACTOR_PPO_KL: ppo_kl.item(), M.ACTOR_PG_CLIPFRAC_LOWER: clipfrac_lower.item(),
               M.ACTOR_ENTROPY: entropy_mean.item()}
    if cfg.use_kl_loss:
        kl = algo_losses.kl_loss(log_prob, mb["ref_log_prob"].to(dev), mask,
                                 cfg.kl_loss_type, cfg.loss_agg_mode)
        loss = loss + cfg.kl_loss_coef * kl
        metrics[M.ACTOR_KL_LOSS] = kl.item()
    return loss, metrics


def sft_loss(model, mb: DataProto):
    """Token-mean next-token cross-entropy over loss_mask [B, T] (1 = a token to predict)."""
    dev = device.device()
    input_ids, attention_mask = mb["input_ids"].to(dev), mb["attention_mask"].to(dev)
    loss_mask = mb["loss_mask"].to(dev).float()[:, 1:]
    logits = forward_logits(model, input_ids, attention_mask)[:, :-1]
    log_probs = log_probs_from_logits(logits, input_ids[:, 1:])
    nll = -aggregate.masked_mean(log_probs, loss_mask)
    correct = (logits.argmax(-1) == input_ids[:, 1:]).float()
    return nll, {"sft/loss": nll.item(), "sft/token_acc": aggregate.masked_mean(correct, loss_mask).item()}


def values_of(model, mb: DataProto) -> torch.Tensor:
    """Critic values at the positions that predict each response token: [B, R] fp32."""
    input_ids, attention_mask, responses = _inputs(mb)
    out = forward_logits(model, input_ids, attention_mask)  # [B, T, 1]
    return response_slice(out, responses.shape[1]).squeeze(-1).float()


def critic_loss(model, mb: DataProto, cfg: CriticConfig):
    dev = device.device()
    mask = mb["response_mask"].to(dev).float()
    vpreds = values_of(model, mb)
    vf_loss, vf_clipfrac = algo_losses.compute_value_loss(
        vpreds=vpreds, returns=mb["returns"].to(dev), values=mb["values"].to(dev),
        response_mask=mask, cliprange_value=cfg.cliprange_value, loss_agg_mode=cfg.loss_agg_mode)
    return vf_loss, {M.CRITIC_VF_LOSS: vf_loss.item(), M.CRITIC_VF_CLIPFRAC: vf_clipfrac.item(),
                     M.CRITIC_VPRED_MEAN: aggregate.masked_mean(vpreds, mask).item()}

