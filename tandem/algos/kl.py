"""KL estimators between the policy and the reference policy, KL controllers, and the in-reward KL penalty.

The estimators follow John Schulman's "Approximating KL divergence" note
(k1, k2, k3) under verl's names. They take per-token log-probs of the *sampled*
tokens, so each is a single-sample estimate of KL(pi || pi_ref) at that token.

Deliberately not here: the KL *loss* term of the actor objective
(``tandem.algos.losses.kl_loss``) and any decision about when to update a
controller (the controller step does that with the returned ``current_kl``).
"""

import torch

from tandem.algos.aggregate import masked_mean
from tandem.algos.metrics import ACTOR_REWARD_KL_PENALTY, ACTOR_REWARD_KL_PENALTY_COEFF

KL_PENALTY_TYPES: tuple[str, ...] = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate from log-probs of the sampled tokens.

    With ``d = log_prob - ref_log_prob``:

    * ``"kl"`` / ``"k1"``: ``d`` (unbiased, can be negative);
    * ``"abs"``: ``|d|``;
    * ``"mse"`` / ``"k2"``: ``0.5 * d**2``;
    * ``"low_var_kl"`` / ``"k3"``: ``exp(-d) - (-d) - 1`` (non-negative, unbiased,
      low variance); ``-d`` is clamped to [-20, 20] before ``exp`` and the result
      to [-10, 10], as in verl.

    Args:
        log_prob: float ``[B, R]`` log-probs under the current (or old) policy.
        ref_log_prob: float ``[B, R]`` log-probs under the reference policy.
        kl_penalty: estimator name (see above).

    Returns:
        float ``[B, R]``, unmasked: padding positions hold whatever the inputs
        give there; mask before reducing.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if kl_penalty in ("kl", "k1"):
        return log_prob - ref_log_prob
    if kl_penalty == "abs":
        return (log_prob - ref_log_prob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (log_prob - ref_log_prob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, min=-10.0, max=10.0)
    raise ValueError(f"unknown kl_penalty {kl_penalty!r}; known estimators: {list(KL_PENALTY_TYPES)}")


# ``apply_kl_penalty``'s ``kl_penalty`` argument (verl's name) shadows the function.
_kl_estimate = kl_penalty


class FixedKLController:
    """A constant KL coefficient ``value``; ``update`` does nothing."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept so both controllers share one interface)."""

    def state_dict(self) -> dict[str, float]:
        """``{"value": coefficient}``."""
        return {"value": self.value}

    def load_state_dict(self, state_dict: dict[str, float]) -> None:
        """Restore ``value`` from ``state_dict()``'s output."""
        self.value = float(state_dict["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient of Ziegler et al. 2019 (arXiv:1909.08593).

    After each step with measured KL ``current_kl`` over ``n_steps`` samples::

        proportional_error = clip(current_kl / target_kl - 1, -0.2, 0.2)
        value *= 1 + proportional_error * n_steps / horizon

    so the coefficient grows when the KL is above target and shrinks below it.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Apply one step of the rule above to ``value``."""
        proportional_error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        """``{"value": coefficient}`` (target and horizon are configuration)."""
        return {"value": self.value}

    def load_state_dict(self, state_dict: dict[str, float]) -> None:
        """Restore ``value`` from ``state_dict()``'s output."""
        self.value = float(state_dict["value"])


def get_kl_controller(
    kl_ctrl_type: str, kl_coef: float, target_kl: float | None = None, horizon: int | None = None
) -> FixedKLController | AdaptiveKLController:
    """Build a controller by type name: ``"fixed"`` or ``"adaptive"`` (needs target_kl, horizon).

    Raises:
        ValueError: unknown type (the message lists the known ones) or missing
            adaptive settings.
    """
    if kl_ctrl_type == "fixed":
        return FixedKLController(kl_coef)
    if kl_ctrl_type == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("adaptive KL controller needs target_kl and horizon")
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown kl_ctrl type {kl_ctrl_type!r}; known types: ['fixed', 'adaptive']")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: FixedKLController | AdaptiveKLController,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Subtract the KL penalty from the reward: ``rewards = scores - beta * kl * mask``.

    Does NOT update ``kl_ctrl``; the caller does, with
    ``kl_ctrl.update(metrics["actor/reward_kl_penalty"], n_steps=batch_size)``.

    Args:
        token_level_scores: float ``[B, R]`` rewards from the reward function.
        old_log_prob: float ``[B, R]`` log-probs of the rollout policy (actor
            before the update).
        ref_log_prob: float ``[B, R]`` reference-policy log-probs.
        response_mask: bool/float ``[B, R]``; 1 on real response tokens.
        kl_ctrl: supplies ``beta = kl_ctrl.value``.
        kl_penalty: estimator name for ``kl_penalty()``.

    Returns:
        token_level_rewards: ``[B, R]`` in ``token_level_scores``' dtype (no grad).
        metrics: ``{"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}``
            as floats; ``current_kl`` is the per-row masked mean KL averaged over
            rows (verl), rows with no real token left out.
    """
    with torch.no_grad():
        keep = response_mask.bool()
        kld = _kl_estimate(old_log_prob, ref_log_prob, kl_penalty).to(token_level_scores.dtype)
        kld = torch.where(keep, kld, torch.zeros((), dtype=kld.dtype, device=kld.device))  # [B, R]
        beta = float(kl_ctrl.value)
        token_level_rewards = token_level_scores - beta * kld
        row_kl = masked_mean(kld, keep, dim=-1)  # [B]
        current_kl = float(masked_mean(row_kl, keep.any(dim=-1)))
    return token_level_rewards, {
        ACTOR_REWARD_KL_PENALTY: current_kl,
        ACTOR_REWARD_KL_PENALTY_COEFF: beta,
    }
