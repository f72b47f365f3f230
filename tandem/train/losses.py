"""Per-micro-batch losses of the actor (PPO, SFT) and critic on a megatron GPTModel.

Batches use verl's column names: input_ids / attention_mask [B, T] hold
[left-padded prompt | right-padded response]; responses / response_mask [B, R].
"""
from __future__ import annotations

import torch

from tandem.algos import aggregate
from tandem.algos import losses as algo_losses
from tandem.algos import metrics as M
from tandem.config import ActorConfig, CriticConfig
from tandem.data.batch import DataProto
from tandem.models.forward import response_slice
from tandem.models.logprobs import gather_vocab, log_probs_from_logits, token_stats
from tandem.models.packing import PackedOutput, take_positions
from tandem.models.scalar_head import token_values
from tandem.parallel import device
from tandem.train.schedule import reads_responses_only

# a bool [B] column the actor's front adds to an update's batch (its update_rows): the row's old
# log-probs are this forward's own (the first mini-batch), not the batch's old_log_probs
ON_POLICY_ROW = "__on_policy_row__"


def loss_units(mask: torch.Tensor, loss_agg_mode: str) -> int:
    """What a loss_agg_mode averages over: kept tokens (token-mean) or rows (seq-mean-*).

    A loss is backpropagated as mean x units and divided by the units of the whole
    mini-batch, which makes the gradient independent of how rows split over micro-batches
    and DP ranks (tandem/train/schedule.py)."""
    if loss_agg_mode == "token-mean":
        return int(mask.bool().sum())
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return int(mask.shape[0])
    return int(mask.bool().any(dim=-1).sum())  # seq-mean modes leave out rows with no token


def response_log_probs(output, mb: DataProto, temperature: float, with_entropy: bool,
                       entropy_grad: bool = False):
    """Model output ([B, T, V/tp] or a PackedOutput) -> (log_probs [B, R], entropy [B, R] or
    None) of the response, fp32. Packed outputs are computed at the positions that predict
    real response tokens only; padding positions get 0 (callers mask them)."""
    responses = mb["responses"]
    b, r = responses.shape
    if isinstance(output, PackedOutput):
        logits, valid = output.tokens(output.shape[1] - r - 1, r)
        labels = responses[valid]
    else:
        logits = response_slice(output, r).reshape(b * r, -1)
        valid, labels = None, responses.reshape(-1)
    lp, ent = token_stats(logits, device.to_device(labels, logits.device), temperature, with_entropy, entropy_grad)
    return _layout(lp, valid, b, r), None if ent is None else _layout(ent, valid, b, r)


def _layout(values: torch.Tensor, valid: torch.Tensor | None, b: int, r: int) -> torch.Tensor:
    """[n] per-token values -> [B, R], zeros where `valid` is False."""
    if valid is None:
        return values.reshape(b, r)
    where = device.to_device(valid.reshape(-1).nonzero().squeeze(1), values.device)  # found on the CPU: no sync
    return values.new_zeros(b * r).index_copy(0, where, values).view(b, r)


@reads_responses_only
def ppo_actor_loss(output: torch.Tensor, mb: DataProto, cfg: ActorConfig, temperature: float):
    """PPO clipped loss (+ entropy bonus, + KL loss) of one micro-batch -> (loss, units, metrics).

    A micro-batch whose rows are marked ON_POLICY_ROW takes this forward's own log-probs as its old
    ones (detached; the numbers a separate log-prob pass gives, so the same loss and gradient); with
    the column, every micro-batch returns its old log-probs per row as metrics["old_log_probs"] [B, R]."""
    on_policy, per_row = _own_old_log_probs(mb)
    dev = device.device()
    mask = device.to_device(mb["response_mask"], dev).float()
    # with no entropy bonus the entropy is only a metric: keep its [n, V] graph out of backward
    log_prob, entropy = response_log_probs(output, mb, temperature, with_entropy=True,
                                           entropy_grad=cfg.entropy_coeff != 0)
    old_log_prob = log_prob.detach() if on_policy else device.to_device(mb["old_log_probs"], dev)
    is_weights, tis_metrics = None, {}
    if cfg.tis_imp_ratio_cap > 0:  # truncated IS: correct for rollout-engine vs trainer log-prob mismatch
        rollout_log_prob = device.to_device(mb["rollout_log_probs"], dev)
        is_weights = algo_losses.compute_truncated_is_weights(old_log_prob, rollout_log_prob, mask,
                                                              cfg.tis_imp_ratio_cap)
        over = (old_log_prob - rollout_log_prob).exp() > cfg.tis_imp_ratio_cap
        tis_metrics = {M.ACTOR_TIS_IMP_RATIO_MEAN: aggregate.masked_mean(is_weights, mask),
                       M.ACTOR_TIS_CLIPFRAC: aggregate.masked_mean(over.float(), mask)}
    common = dict(old_log_prob=old_log_prob, log_prob=log_prob, is_weights=is_weights,
                  advantages=device.to_device(mb["advantages"], dev), response_mask=mask, loss_agg_mode=cfg.loss_agg_mode)
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
    metrics = {M.ACTOR_PG_LOSS: pg_loss, M.ACTOR_PG_CLIPFRAC: clipfrac, M.ACTOR_PPO_KL: ppo_kl,
               M.ACTOR_PG_CLIPFRAC_LOWER: clipfrac_lower, M.ACTOR_ENTROPY: entropy_mean, **tis_metrics}
    if cfg.use_kl_loss:
        kl = algo_losses.kl_loss(log_prob, device.to_device(mb["ref_log_prob"], dev), mask,
                                 cfg.kl_loss_type, cfg.loss_agg_mode)
        loss = loss + cfg.kl_loss_coef * kl
        metrics[M.ACTOR_KL_LOSS] = kl
    out = _scalars(metrics)
    if per_row:  # per row, left on the device: train_steps reads them back once per mini-batch
        out["old_log_probs"] = old_log_prob.float()
    return loss, loss_units(mb["response_mask"], cfg.loss_agg_mode), out


def _own_old_log_probs(mb: DataProto) -> tuple[bool, bool]:
    """-> (whether this micro-batch takes its own forward's old log-probs, whether it returns its
    old log-probs per row). Marked rows form whole mini-batches, so a micro-batch is all or none."""
    own = mb.tensors.get(ON_POLICY_ROW)
    if own is None:
        return False, False
    if bool(own.any()) != bool(own.all()):
        raise ValueError(f"{ON_POLICY_ROW}: a micro-batch mixes rows with and without their own old log-probs")
    return bool(own.all()), True


def _scalars(metrics: dict) -> dict:
    """Metric tensors -> detached fp32 scalars, left on the device: train_steps reads them all
    back in one copy per call (a read here would wait for every micro-batch's forward)."""
    return {k: v.detach().float().reshape(()) for k, v in metrics.items()}


def sft_loss(output: torch.Tensor, mb: DataProto):
    """Token-mean next-token cross-entropy over loss_mask [B, T] (1 = a token to predict)."""
    dev = output.device
    input_ids = device.to_device(mb["input_ids"], dev)
    loss_mask = device.to_device(mb["loss_mask"], dev).float()[:, 1:]
    logits = take_positions(output, 0, output.shape[1] - 1)
    log_probs = log_probs_from_logits(logits, input_ids[:, 1:])
    nll = -aggregate.masked_mean(log_probs, loss_mask)
    correct = (gather_vocab(logits.detach()).argmax(-1) == input_ids[:, 1:]).float()
    return nll, loss_units(mb["loss_mask"][:, 1:], "token-mean"), _scalars({
        "sft/loss": nll, "sft/token_acc": aggregate.masked_mean(correct, loss_mask)})


def values_of(output: torch.Tensor, mb: DataProto) -> torch.Tensor:
    """Critic output [B, T, 1] -> values at the positions that predict each response token: [B, R] fp32."""
    r = mb["responses"].shape[1]
    return token_values(output, output.shape[1] - r - 1, r)


def critic_loss(output: torch.Tensor, mb: DataProto, cfg: CriticConfig):
    dev = device.device()
    mask = device.to_device(mb["response_mask"], dev).float()
    vpreds = values_of(output, mb)
    vf_loss, vf_clipfrac = algo_losses.compute_value_loss(
        vpreds=vpreds, returns=device.to_device(mb["returns"], dev), values=device.to_device(mb["values"], dev),
        response_mask=mask, cliprange_value=cfg.cliprange_value, loss_agg_mode=cfg.loss_agg_mode)
    return vf_loss, loss_units(mb["response_mask"], cfg.loss_agg_mode), _scalars({
        M.CRITIC_VF_LOSS: vf_loss, M.CRITIC_VF_CLIPFRAC: vf_clipfrac,
        M.CRITIC_VPRED_MEAN: aggregate.masked_mean(vpreds, mask)})

