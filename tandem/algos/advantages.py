"""Advantage estimators: GAE, GRPO, RLOO, REINFORCE++ (with and without baseline), ReMax.

Semantics follow verl's ``verl/trainer/ppo/core_algos.py``; every estimator
returns ``(advantages, returns)``, both float ``[B, R]`` and both exactly zero
on masked-out positions. All estimators run under ``torch.no_grad()``: their
outputs are targets, never part of the graph.

Estimators are registered by name in ``ADV_ESTIMATORS``. Their signatures differ
(GAE needs values, GRPO needs group ids, ReMax needs baselines);
``compute_advantage`` calls one by name with only the inputs it accepts.

Group ids (``index``) say which rows were sampled from the same prompt: a
LongTensor ``[B]`` or any sequence of ``B`` hashables (e.g. uid strings).
Group statistics are computed in float64 and cast back.
"""

import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from tandem.algos.aggregate import masked_sum, masked_whiten

GroupIndex = torch.Tensor | Sequence[Hashable]

ADV_ESTIMATORS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}


def register_adv_estimator(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage estimator under ``name`` in ``ADV_ESTIMATORS``.

    Raises:
        ValueError: ``name`` is already registered.
    """

    def decorator(fn: Callable) -> Callable:
        if name in ADV_ESTIMATORS:
            existing = ADV_ESTIMATORS[name].__qualname__
            raise ValueError(f"advantage estimator {name!r} is already registered ({existing})")
        ADV_ESTIMATORS[name] = fn
        return fn

    return decorator


def get_adv_estimator(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The estimator registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name not in ADV_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; known estimators: {sorted(ADV_ESTIMATORS)}")
    return ADV_ESTIMATORS[name]


def uses_group_ids(name: str) -> bool:
    """Whether estimator ``name`` takes group ids (``index``): its baseline comes from the other
    samples of the same prompt, so it needs at least two per prompt (a group of one has none)."""
    return "index" in inspect.signature(get_adv_estimator(name)).parameters


def compute_advantage(adv_estimator: str, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Call the estimator ``adv_estimator`` with the subset of ``inputs`` it accepts.

    Lets a caller pass every column it has (``token_level_rewards``, ``values``,
    ``response_mask``, ``index``, ``gamma``, ``lam``, ...) whatever the estimator.
    A missing required argument raises ``TypeError`` as a normal call would;
    inputs the estimator does not take are ignored.
    """
    fn = get_adv_estimator(adv_estimator)
    accepted = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in inputs.items() if k in accepted})


def _mask_zero(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``values`` with exact zeros where ``response_mask`` is zero (NaN in padding dropped)."""
    return torch.where(response_mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def _group_ids(index: GroupIndex, batch_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Map group ids to dense ``0..G-1``: returns (LongTensor ``[B]``, G)."""
    if isinstance(index, torch.Tensor):
        if index.dim() != 1 or index.shape[0] != batch_size:
            raise ValueError(f"index must have shape [{batch_size}], got {list(index.shape)}")
        uniq, inverse = torch.unique(index, return_inverse=True)
        return inverse.to(device), int(uniq.numel())
    if len(index) != batch_size:
        raise ValueError(f"index has {len(index)} entries, expected one per row ({batch_size})")
    dense: dict[Hashable, int] = {}
    ids = [dense.setdefault(g, len(dense)) for g in index]
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def _group_stats(scores: torch.Tensor, index: GroupIndex) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row statistics of the row's group, in float64.

    Args:
        scores: float ``[B]``.
        index: group ids, ``[B]``.

    Returns:
        (mean, std, size), each float64 ``[B]``: the mean, the unbiased std (as
        ``torch.std``) and the size of the group the row belongs to. For a group
        of one row the std is reported as 1 (its unbiased std is undefined).
    """
    batch_size = scores.shape[0]
    ids, num_groups = _group_ids(index, batch_size, scores.device)
    s = scores.to(torch.float64)
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=s.device)
    size = zeros.index_add(0, ids, torch.ones_like(s))  # [G]
    mean = zeros.index_add(0, ids, s) / size  # [G]
    sq_dev = zeros.index_add(0, ids, (s - mean[ids]) ** 2)  # [G]
    std = torch.where(size > 1, torch.sqrt(sq_dev / (size - 1).clamp_min(1)), torch.ones_like(size))
    return mean[ids], std[ids], size[ids]


@register_adv_estimator("gae")
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015), as in verl.

    Backwards over t: ``delta_t = r_t + gamma * V_next - V_t``,
    ``A_t = delta_t + gamma * lam * A_next``, where ``V_next`` / ``A_next`` are the
    value / advantage of the next *masked-in* token of the row and 0 if there is
    none. Consequences:

    * right padding: positions after a row's last real token are never
      bootstrapped from; the last real token is terminal (``V_next = 0``), also for
      rows cut at the length limit (verl does the same);
    * interior zeros in the mask (e.g. tool-observation tokens of a multi-turn
      response) are skipped: the token before them connects to the one after;
    * rewards and values at masked-out positions are ignored entirely.

    Args:
        token_level_rewards: float ``[B, R]`` per-token rewards (score at the
            last token, minus any KL penalty).
        values: float ``[B, R]`` critic values ``V(s_t)`` (old values).
        response_mask: bool/float ``[B, R]``; 1 on real response tokens.
        gamma: discount factor.
        lam: GAE lambda.

    Returns:
        advantages: ``[B, R]`` in ``values``' dtype, whitened over the mask
            (mean 0, unbiased std 1 across all real tokens), 0 where masked.
        returns: ``[B, R]``, unwhitened advantages + values (the critic target),
            0 where masked.
    """
    with torch.no_grad():
        keep = response_mask.bool()  # [B, R]
        rewards = token_level_rewards.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])  # [B]
        next_adv = torch.zeros_like(values[:, 0])  # [B]
        advantages = torch.zeros_like(values)  # [B, R]
        for t in reversed(range(values.shape[1])):
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            adv_t = delta + gamma * lam * next_adv
            next_adv = torch.where(keep[:, t], adv_t, next_adv)
            next_value = torch.where(keep[:, t], values[:, t], next_value)
            advantages[:, t] = next_adv
        returns = _mask_zero(advantages + values, keep)
        advantages = _mask_zero(masked_whiten(advantages, keep), keep)
    return advantages, returns


@register_adv_estimator("grpo")
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: the row's score normalised within its group.

    ``score_i`` = sum of the row's rewards on real tokens;
    ``A_i = (score_i - mean_g) / (std_g + epsilon)`` (or ``score_i - mean_g`` with
    ``norm_adv_by_std_in_grpo=False``, Dr.GRPO), with ``std_g`` unbiased as
    ``torch.std``. As in verl, a group of one row uses mean 0 and std 1, so its
    advantage is ``score / (1 + epsilon)``.

    Args:
        token_level_rewards: float ``[B, R]``.
        response_mask: bool/float ``[B, R]``; 1 on real response tokens.
        index: group ids, LongTensor ``[B]`` or ``B`` hashables.
        epsilon: added to the std.
        norm_adv_by_std_in_grpo: divide by the group std.

    Returns:
        (advantages, returns): the same ``[B, R]`` tensor twice, ``A_i`` broadcast
        over the row's real tokens, 0 where masked, ``token_level_rewards``' dtype.
    """
    with torch.no_grad():
        scores = masked_sum(token_level_rewards, response_mask, dim=-1)  # [B]
        mean, std, size = _group_stats(scores, index)
        mean = torch.where(size > 1, mean, torch.zeros_like(mean))
        adv = scores.to(torch.float64) - mean
        if norm_adv_by_std_in_grpo:
            adv = adv / (std + epsilon)
        adv = _mask_zero(adv.to(token_level_rewards.dtype).unsqueeze(-1).expand_as(token_level_rewards), response_mask)
    return adv, adv


@register_adv_estimator("rloo")
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024): score minus the mean score of the *other* rows of the group.

    For a group of n > 1 rows: ``A_i = score_i - (sum_g - score_i) / (n - 1)``
    ``= (score_i - mean_g) * n / (n - 1)``. A group of one row keeps its raw score
    (verl). ``epsilon`` is accepted for signature parity with verl and unused.

    Args:
        token_level_rewards: float ``[B, R]``.
        response_mask: bool/float ``[B, R]``; 1 on real response tokens.
        index: group ids, LongTensor ``[B]`` or ``B`` hashables.

    Returns:
        (advantages, returns): the same ``[B, R]`` tensor twice, broadcast over
        real tokens, 0 where masked.
    """
    del epsilon
    with torch.no_grad():
        scores = masked_sum(token_level_rewards, response_mask, dim=-1)  # [B]
        mean, _, size = _group_stats(scores, index)
        s = scores.to(torch.float64)
        adv = torch.where(size > 1, (s - mean) * size / (size - 1).clamp_min(1), s)
        adv = _mask_zero(adv.to(token_level_rewards.dtype).unsqueeze(-1).expand_as(token_level_rewards), response_mask)
    return adv, adv


@register_adv_estimator("reinforce_plus_plus")
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go per token, whitened over the batch.

    ``G_t = r_t + gamma * G_{t+1}``, where the running return is reset to 0 across
    a masked-out position (verl's "reset after EOS"): padding never feeds the real
    tokens before it.

    Args:
        token_level_rewards: float ``[B, R]``.
        response_mask: bool/float ``[B, R]``; 1 on real response tokens.
        gamma: discount factor.

    Returns:
        advantages: ``[B, R]`` returns whitened over the mask, 0 where masked.
        returns: ``[B, R]`` unwhitened discounted returns, 0 where masked.
    """
    with torch.no_grad():
        keep = response_mask.bool()
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])  # [B]
        for t in reversed(range(token_level_rewards.shape[1])):
            running = token_level_rewards[:, t] + gamma * running
            running = _mask_zero(running, keep[:, t])
            returns[:, t] = running
        advantages = _mask_zero(masked_whiten(returns, keep), keep)
    return advantages, returns


@register_adv_estimator("reinforce_plus_plus_baseline")
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: score minus its group mean, then whitened over all real tokens.

    A group of one row uses mean 0 (verl). Whitening is over tokens, so a long
    row weighs more in the batch statistics than a short one (as in verl).
    ``epsilon`` is accepted for signature parity with verl and unused.

    Args:
        token_level_rewards: float ``[B, R]``.
        response_mask: bool/float ``[B, R]``; 1 on real response tokens.
        index: group ids, LongTensor ``[B]`` or ``B`` hashables.

    Returns:
        (advantages, returns): the same ``[B, R]`` tensor twice, 0 where masked.
    """
    del epsilon
    with torch.no_grad():
        keep = response_mask.bool()
        scores = masked_sum(token_level_rewards, keep, dim=-1)  # [B]
        mean, _, size = _group_stats(scores, index)
        centred = scores.to(torch.float64) - torch.where(size > 1, mean, torch.zeros_like(mean))
        adv = centred.to(token_level_rewards.dtype).unsqueeze(-1).expand_as(token_level_rewards)
        adv = _mask_zero(masked_whiten(adv, keep), keep)
    return adv, adv


@register_adv_estimator("remax")
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023): undiscounted return-to-go minus the greedy rollout's reward.

    Args:
        token_level_rewards: float ``[B, R]``.
        reward_baselines: float ``[B]``, the score of the greedy response to the
            same prompt.
        response_mask: bool/float ``[B, R]``; 1 on real response tokens.

    Returns:
        advantages: ``[B, R]``, ``returns - reward_baselines[:, None]`` on real
            tokens, 0 where masked.
        returns: ``[B, R]``, sum of the row's real-token rewards from t to the end,
            0 where masked.
    """
    with torch.no_grad():
        keep = response_mask.bool()
        kept_rewards = _mask_zero(token_level_rewards, keep)
        returns = _mask_zero(kept_rewards.flip(-1).cumsum(-1).flip(-1), keep)
        baseline = reward_baselines.to(returns.dtype).unsqueeze(-1)  # [B, 1]
        advantages = _mask_zero(returns - baseline, keep)
    return advantages, returns
