"""Actor and critic losses: clipped PPO (clip-higher, dual-clip), GSPO, clipped value loss,
entropy, KL loss, truncated importance-sampling (TIS) weights.

Semantics follow verl's ``verl/trainer/ppo/core_algos.py``. Every loss takes
token-level ``[B, R]`` tensors and a ``response_mask`` and reduces with
``agg_loss``; the diagnostics it returns (clip fractions, approximate KL) are
detached 0-d tensors. Inputs at padding positions must be finite for the
gradient to be finite (their loss is masked out, but exp() of NaN is not).

Deliberately not here: micro-batch / data-parallel normalisation, entropy or KL
*coefficients* (the training step combines terms), and computing log-probs from
logits (``tandem.models.logprobs``).
"""

import torch

from tandem.algos.aggregate import agg_loss, masked_mean
from tandem.algos.kl import kl_penalty

# actor_rollout_ref.actor.policy_loss.loss_mode: "vanilla" is compute_policy_loss (token-level
# ratio), "gspo" compute_gspo_policy_loss (sequence-level ratio); tandem/train/losses.py dispatches.
POLICY_LOSS_MODES: tuple[str, ...] = ("vanilla", "gspo")

# log-ratios are clamped to this range before exp(), as in verl.
_LOG_RATIO_CLAMP = 20.0


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate loss with clip-higher (DAPO) and dual-clip (Ye et al. 2019).

    Per token, with ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``::

        loss1 = -A * ratio
        loss2 = -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
        clipped = max(loss1, loss2)                 # standard PPO
        loss = min(clipped, -A * clip_ratio_c)      # only where A < 0 (dual-clip)

    Args:
        old_log_prob: float ``[B, R]`` log-probs of the sampled tokens under the
            policy that generated the batch (no grad).
        log_prob: float ``[B, R]`` log-probs under the current policy (grad flows).
        advantages: float ``[B, R]``.
        response_mask: bool/float ``[B, R]``; 1 on tokens that count.
        clip_ratio: default for both clip sides.
        clip_ratio_low: lower side, ``ratio >= 1 - clip_ratio_low``; None = clip_ratio.
        clip_ratio_high: upper side, ``ratio <= 1 + clip_ratio_high``; None = clip_ratio.
        clip_ratio_c: dual-clip bound (> 1) on the loss of negative-advantage tokens.
        loss_agg_mode: see ``agg_loss``.
        is_weights: optional float ``[B, R]`` detached per-token weights (truncated
            IS, ``compute_truncated_is_weights``) multiplied into the per-token loss
            after clipping, before aggregation (verl's TIS). The diagnostics ignore them.

    Returns:
        pg_loss: 0-d, the aggregated loss.
        pg_clipfrac: 0-d, masked fraction of tokens where ``loss2 > loss1`` (the
            clipped branch is active).
        ppo_kl: 0-d, ``masked_mean(old_log_prob - log_prob)`` (the log-ratio
            clamped to [-20, 20] as above), the k1 estimate of KL(old || new).
        pg_clipfrac_lower: 0-d, masked fraction of tokens with ``A < 0`` where the
            dual clip is active.
        When ``log_prob == old_log_prob`` exactly, ppo_kl and both clip
        fractions are exactly 0.

    Raises:
        ValueError: ``clip_ratio_c <= 1``.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high

    log_ratio = torch.clamp(log_prob - old_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # [B, R]
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio.detach(), response_mask)

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    pg_clipfrac = masked_mean((loss_clipped > loss_unclipped).to(ratio.dtype).detach(), response_mask)

    loss_dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_clipfrac_lower = masked_mean(((loss_ppo > loss_dual_bound) & negative).to(ratio.dtype).detach(), response_mask)

    pg_losses = torch.where(negative, torch.minimum(loss_ppo, loss_dual_bound), loss_ppo)
    if is_weights is not None:
        pg_losses = pg_losses * is_weights.detach()
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_gspo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    loss_agg_mode: str = "seq-mean-token-mean",
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): PPO clipping on a sequence-level ratio.

    The sequence ratio is the geometric mean of token ratios over real tokens,
    ``s_i = exp(mean_t (log_prob - old_log_prob))``. Each token uses
    ``s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)]``: numerically ``s_i``, but its
    gradient is ``s_i * grad log pi(y_t)``, so the tokens of a row together
    carry the gradient of ``s_i``. The log of ``s_i,t`` is clamped at 10 (verl).
    Then ``loss = max(-A * s_i,t, -A * clip(s_i,t, 1 - low, 1 + high))``.

    Args:
        old_log_prob: float ``[B, R]`` (no grad).
        log_prob: float ``[B, R]`` (grad flows).
        advantages: float ``[B, R]`` (constant over a row for outcome rewards).
        response_mask: bool/float ``[B, R]``; 1 on real tokens.
        clip_ratio_low: ``s >= 1 - clip_ratio_low`` (the paper uses ~3e-4).
        clip_ratio_high: ``s <= 1 + clip_ratio_high`` (the paper uses ~4e-4).
        loss_agg_mode: see ``agg_loss``; the paper's objective is
            ``"seq-mean-token-mean"`` (verl hard-codes it; Tandem honours the argument).
        is_weights: optional detached ``[B, R]`` per-token TIS weights, multiplied
            into the per-token loss before aggregation (as in ``compute_policy_loss``).

    Returns:
        (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower) as in
        ``compute_policy_loss``; ``ppo_kl`` is the token-level k1 mean and
        ``pg_clipfrac_lower`` is always 0 (no dual clip).
    """
    keep = response_mask.bool()
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    log_ratio = torch.where(keep, log_prob - old_log_prob, zero)  # [B, R]
    seq_log_ratio = masked_mean(log_ratio, keep, dim=-1)  # [B], 0 for an empty row
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [B, R]
    seq_ratio = torch.exp(torch.clamp(log_seq_ratio, max=10.0))

    loss_unclipped = -advantages * seq_ratio
    loss_clipped = -advantages * torch.clamp(seq_ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    if is_weights is not None:
        pg_losses = pg_losses * is_weights.detach()
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)

    pg_clipfrac = masked_mean((loss_clipped > loss_unclipped).to(seq_ratio.dtype).detach(), response_mask)
    ppo_kl = masked_mean(-log_ratio.detach(), response_mask)
    pg_clipfrac_lower = torch.zeros((), dtype=pg_loss.dtype, device=pg_loss.device)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss: ``0.5 * agg(max((vpred - ret)^2, (clip(vpred, values +- c) - ret)^2))``.

    Args:
        vpreds: float ``[B, R]`` current critic predictions (grad flows).
        returns: float ``[B, R]`` targets (e.g. GAE returns).
        values: float ``[B, R]`` critic values at rollout time (the clip centre).
        response_mask: bool/float ``[B, R]``; 1 on tokens that count.
        cliprange_value: ``c``, half-width of the clip window around ``values``.
        loss_agg_mode: see ``agg_loss``.

    Returns:
        vf_loss: 0-d aggregated loss (including the 0.5).
        vf_clipfrac: 0-d, masked fraction of tokens where the clipped error is
            the larger one (``>``, so 0 when vpreds == values).
    """
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    err_unclipped = (vpreds - returns) ** 2
    err_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(err_unclipped, err_clipped), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean((err_clipped > err_unclipped).to(vpreds.dtype).detach(), response_mask)
    return vf_loss, vf_clipfrac


def compute_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution ``softmax(logits)`` over the last dim.

    Computed in float32 (or float64 if given) from ``log_softmax``, so it is stable
    for large logits; entries at ``-inf`` (masked vocabulary) contribute 0 and give
    finite gradients.

    Args:
        logits: float ``[..., V]``, any float dtype.

    Returns:
        float32 (or float64) ``[...]`` entropies in nats, differentiable.
    """
    logits = logits.float() if logits.dtype != torch.float64 else logits
    log_p = torch.log_softmax(logits, dim=-1)
    p = log_p.exp()
    safe_log_p = torch.where(p > 0, log_p, torch.zeros((), dtype=log_p.dtype, device=log_p.device))
    return -(p * safe_log_p).sum(dim=-1)


def kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_loss_type: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
) -> torch.Tensor:
    """KL-to-reference loss term: ``agg_loss(kl_penalty(log_prob, ref_log_prob, kl_loss_type))``.

    Args:
        log_prob: float ``[B, R]`` current-policy log-probs (grad flows).
        ref_log_prob: float ``[B, R]`` reference log-probs (no grad).
        response_mask: bool/float ``[B, R]``; 1 on tokens that count.
        kl_loss_type: estimator name, see ``tandem.algos.kl.kl_penalty``.
        loss_agg_mode: see ``agg_loss``.

    Returns:
        0-d loss (multiply by the KL coefficient in the caller).
    """
    return agg_loss(kl_penalty(log_prob, ref_log_prob, kl_loss_type), response_mask, loss_agg_mode)


def compute_truncated_is_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float,
) -> torch.Tensor:
    """Truncated importance-sampling (TIS) weights correcting rollout-engine vs trainer mismatch.

    ``w = min(exp(old_log_prob - rollout_log_prob), cap)`` per token (log-ratio
    clamped to [-20, 20] before exp). Multiply the per-token policy loss by ``w``.

    Args:
        old_log_prob: float ``[B, R]`` trainer log-probs of the sampled tokens.
        rollout_log_prob: float ``[B, R]`` log-probs the rollout engine reported.
        response_mask: bool/float ``[B, R]``; 1 on real tokens.
        cap: upper bound on the weight (> 0), e.g. 2.0.

    Returns:
        float ``[B, R]`` detached weights, 0 where masked.

    Raises:
        ValueError: ``cap <= 0``.
    """
    if cap <= 0:
        raise ValueError(f"TIS cap must be > 0, got {cap}")
    with torch.no_grad():
        log_ratio = torch.clamp(old_log_prob - rollout_log_prob, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        weights = torch.clamp(torch.exp(log_ratio), max=cap)
        return torch.where(response_mask.bool(), weights, torch.zeros((), dtype=weights.dtype, device=weights.device))
