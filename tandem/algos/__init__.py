"""PPO/GRPO math as pure tensor functions (torch only; no I/O, no distributed calls).

Shapes: token-level tensors are ``[B, R]`` (R = padded response length) and
``response_mask`` is ``[B, R]`` bool/float with 1 on real response tokens.
Semantics and names mirror verl's ``verl/trainer/ppo/core_algos.py``; each
function's docstring states where Tandem deliberately differs.

Modules: ``aggregate`` (masked reductions, loss_agg_mode), ``advantages``
(estimators + registry), ``dapo`` (overlong penalty, group filter), ``kl`` (estimators, controllers, in-reward penalty),
``losses`` (policy/value/entropy/KL losses, TIS), ``metrics`` (logged names).
"""

from tandem.algos.advantages import (
    ADV_ESTIMATORS,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_adv_estimator,
    register_adv_estimator,
    uses_group_ids,
)
from tandem.algos.aggregate import (
    LOSS_AGG_MODES,
    agg_loss,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from tandem.algos.dapo import compute_overlong_penalty, varied_group_mask
from tandem.algos.kl import (
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)
from tandem.algos.losses import (
    POLICY_LOSS_MODES,
    compute_entropy_from_logits,
    compute_gspo_policy_loss,
    compute_policy_loss,
    compute_truncated_is_weights,
    compute_value_loss,
    kl_loss,
)
from tandem.algos.metrics import DEFINITIONS, compute_data_metrics, explained_variance

__all__ = [
    "ADV_ESTIMATORS",
    "DEFINITIONS",
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_data_metrics",
    "compute_entropy_from_logits",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_overlong_penalty",
    "compute_gspo_policy_loss",
    "compute_policy_loss",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_truncated_is_weights",
    "compute_value_loss",
    "explained_variance",
    "get_adv_estimator",
    "get_kl_controller",
    "kl_loss",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_estimator",
    "uses_group_ids",
    "varied_group_mask",
]
