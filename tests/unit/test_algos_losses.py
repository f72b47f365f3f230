"""Hand-worked tests for tandem.algos.losses."""

import math

import pytest
import torch

from tandem.algos.losses import (
    compute_entropy_from_logits,
    compute_gspo_policy_loss,
    compute_policy_loss,
    compute_truncated_is_weights,
    compute_value_loss,
    kl_loss,
)

F64 = torch.float64


def t(rows, **kw):
    return torch.tensor(rows, dtype=F64, **kw)


def log_probs_for(ratios, old=-1.0):
    """old_log_prob (all ``old``) and log_prob such that exp(log_prob - old) == ratios."""
    ratios = t(ratios)
    old_log_prob = torch.full_like(ratios, old)
    return old_log_prob, (old_log_prob + ratios.log()).requires_grad_(True)


# ---- PPO policy loss ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, F64])
def test_policy_loss_on_policy_is_exactly_zero(dtype):
    gen = torch.Generator().manual_seed(0)
    log_prob = (-5 * torch.rand(4, 7, generator=gen)).to(dtype)
    old = log_prob.clone()
    advantages = torch.randn(4, 7, generator=gen).to(dtype)  # both signs
    mask = torch.rand(4, 7, generator=gen) > 0.3
    for kwargs in ({}, {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}, {"clip_ratio_c": 1.5}):
        pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(old, log_prob, advantages, mask, **kwargs)
        assert ppo_kl.item() == 0.0
        assert clipfrac.item() == 0.0
        assert clipfrac_lower.item() == 0.0
    # ratio is exactly 1, so the loss is -mean(A) over real tokens
    expected = -(advantages.double() * mask).sum() / mask.sum()
    assert pg_loss.double().item() == pytest.approx(expected.item(), rel=1e-2 if dtype == torch.bfloat16 else 1e-6)


# Four tokens, old_log_prob = -1, all real:
#   t0: ratio 1.25, A = +1   t1: ratio 1.5, A = +1   t2: ratio 0.5, A = +1   t3: ratio 0.7, A = -1
RATIOS = [[1.25, 1.5, 0.5, 0.7]]
ADV = [[1.0, 1.0, 1.0, -1.0]]
PPO_KL = -(math.log(1.25) + math.log(1.5) + math.log(0.5) + math.log(0.7)) / 4


def test_policy_loss_clip_higher_asymmetric_by_hand():
    # clip window [1 - 0.2, 1 + 0.28] = [0.8, 1.28]:
    #   t0: -1.25 vs -clip(1.25) = -1.25       -> -1.25   (inside: NOT clipped)
    #   t1: -1.5  vs -1.28                     -> -1.28   clipped
    #   t2: -0.5  vs -0.8                      -> -0.5    not clipped (max picks the unclipped)
    #   t3: +0.7  vs +0.8                      -> +0.8    clipped; dual bound 3 * 1 = 3 not hit
    # token-mean: (-1.25 - 1.28 - 0.5 + 0.8) / 4 = -0.5575; clipfrac 2/4
    old, logp = log_probs_for(RATIOS)
    pg_loss, clipfrac, ppo_kl, lower = compute_policy_loss(
        old, logp, t(ADV), torch.ones(1, 4), clip_ratio_low=0.2, clip_ratio_high=0.28
    )
    assert pg_loss.item() == pytest.approx(-0.5575, abs=1e-12)
    assert clipfrac.item() == 0.5
    assert lower.item() == 0.0
    assert ppo_kl.item() == pytest.approx(PPO_KL, abs=1e-12)
    # gradient w.r.t. log_prob: d(-A * ratio)/dlogp = -A * ratio on unclipped tokens, 0 on clipped; / 4
    pg_loss.backward()
    torch.testing.assert_close(logp.grad, t([[-1.25 / 4, 0.0, -0.5 / 4, 0.0]]), rtol=0, atol=1e-12)


def test_policy_loss_symmetric_clip_by_hand():
    # clip window [0.8, 1.2]: t0 now clipped (-1.2), t1 -1.2, t2 -0.5, t3 +0.8
    # token-mean (-1.2 - 1.2 - 0.5 + 0.8) / 4 = -0.525; clipfrac 3/4
    old, logp = log_probs_for(RATIOS)
    pg_loss, clipfrac, ppo_kl, lower = compute_policy_loss(old, logp, t(ADV), torch.ones(1, 4), clip_ratio=0.2)
    assert pg_loss.item() == pytest.approx(-0.525, abs=1e-12)
    assert clipfrac.item() == 0.75
    assert lower.item() == 0.0


def test_policy_loss_dual_clip_negative_advantage_by_hand():
    # clip 0.2, clip_ratio_c 3; last token is padding with a junk ratio
    #   t0: ratio 5, A = -1: PPO max(5, 1.2) = 5 > dual bound 3  -> 3   (dual clip hit, constant)
    #   t1: ratio 5, A = +1: max(-5, -1.2) = -1.2 (clipped); dual clip never applies to A >= 0
    #   t2: ratio 2, A = -2: max(4, 2.4) = 4 < bound 6           -> 4   (neither clip)
    # token-mean (3 - 1.2 + 4) / 3 = 5.8 / 3; clipfrac 1/3 (t1); clipfrac_lower 1/3 (t0)
    old, logp = log_probs_for([[5.0, 5.0, 2.0, 40.0]])
    advantages = t([[-1.0, 1.0, -2.0, -9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    pg_loss, clipfrac, ppo_kl, lower = compute_policy_loss(
        old, logp, advantages, mask, clip_ratio=0.2, clip_ratio_c=3.0
    )
    assert pg_loss.item() == pytest.approx(5.8 / 3, abs=1e-12)
    assert clipfrac.item() == pytest.approx(1 / 3, abs=1e-15)
    assert lower.item() == pytest.approx(1 / 3, abs=1e-15)
    assert ppo_kl.item() == pytest.approx(-(2 * math.log(5) + math.log(2)) / 3, abs=1e-12)
    # only t2 carries gradient: -A * ratio / 3 = 2 * 2 / 3
    pg_loss.backward()
    torch.testing.assert_close(logp.grad, t([[0.0, 0.0, 4 / 3, 0.0]]), rtol=0, atol=1e-12)


def test_policy_loss_rejects_bad_dual_clip():
    old, logp = log_probs_for(RATIOS)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_policy_loss(old, logp, t(ADV), torch.ones(1, 4), clip_ratio_c=1.0)


def test_policy_loss_agg_modes_by_hand():
    # on-policy so the per-token loss is exactly -A; A = [[1,2,3],[4,5,6]], mask [[1,1,0],[1,0,0]]
    #   token-mean -7/3; seq-mean-token-sum -(3 + 4)/2; seq-mean-token-mean -(1.5 + 4)/2; sum-norm -7/6
    log_prob = t([[-1.0, -2.0, -3.0], [-0.5, -0.1, -4.0]])
    advantages = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    expected = {"token-mean": -7 / 3, "seq-mean-token-sum": -3.5, "seq-mean-token-mean": -2.75,
                "seq-mean-token-sum-norm": -7 / 6}  # fmt: skip
    for mode, value in expected.items():
        pg_loss, *_ = compute_policy_loss(log_prob, log_prob.clone(), advantages, mask, loss_agg_mode=mode)
        assert pg_loss.item() == pytest.approx(value, abs=1e-12), mode
    with pytest.raises(ValueError, match="token-mean"):
        compute_policy_loss(log_prob, log_prob, advantages, mask, loss_agg_mode="sum")


# ---- GSPO --------------------------------------------------------------------------

# row 0: token log-ratios [0.2, 0.4] -> s = exp(0.3); A = +1
# row 1: token log-ratios [-0.05, pad 3.0] -> s = exp(-0.05); A = -1
GSPO_OLD = t([[-1.0, -1.0], [-1.0, -1.0]])
GSPO_LOG_RATIO = t([[0.2, 0.4], [-0.05, 3.0]])
GSPO_ADV = t([[1.0, 1.0], [-1.0, -1.0]])
GSPO_MASK = torch.tensor([[1, 1], [1, 0]])


def test_gspo_by_hand():
    # window [0.9, 1.2]: row 0 s = 1.349859 -> clipped to 1.2: loss -1.2 per token
    #                    row 1 s = 0.951229 inside -> loss +0.951229
    # seq-mean-token-mean: (-1.2 + 0.951229) / 2; clipfrac over tokens: 2 of 3
    # ppo_kl = -(0.2 + 0.4 - 0.05) / 3
    logp = (GSPO_OLD + GSPO_LOG_RATIO).requires_grad_(True)
    pg_loss, clipfrac, ppo_kl, lower = compute_gspo_policy_loss(
        GSPO_OLD, logp, GSPO_ADV, GSPO_MASK, clip_ratio_low=0.1, clip_ratio_high=0.2
    )
    assert pg_loss.item() == pytest.approx((-1.2 + math.exp(-0.05)) / 2, abs=1e-12)
    assert clipfrac.item() == pytest.approx(2 / 3, abs=1e-15)
    assert ppo_kl.item() == pytest.approx(-0.55 / 3, abs=1e-12)
    assert lower.item() == 0.0


def test_gspo_gradient_is_sequence_ratio_gradient():
    # with a window wide enough to never clip, the row loss is -A * s_i with
    # s_i = exp(mean_t log-ratio), so d/dlogp_t = -A * s_i / L_i, times 1/B for the seq-mean
    #   row 0: -exp(0.3) / (2 * 2);  row 1: +exp(-0.05) / (1 * 2);  padding 0
    logp = (GSPO_OLD + GSPO_LOG_RATIO).requires_grad_(True)
    pg_loss, clipfrac, _, _ = compute_gspo_policy_loss(GSPO_OLD, logp, GSPO_ADV, GSPO_MASK, 0.9, 9.0)
    assert clipfrac.item() == 0.0
    pg_loss.backward()
    expected = t([[-math.exp(0.3) / 4, -math.exp(0.3) / 4], [math.exp(-0.05) / 2, 0.0]])
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-12)


def test_gspo_on_policy_is_exactly_zero():
    gen = torch.Generator().manual_seed(1)
    log_prob = -5 * torch.rand(3, 6, generator=gen)
    advantages = torch.randn(3, 1, generator=gen).expand(3, 6)
    mask = torch.rand(3, 6, generator=gen) > 0.3
    old = log_prob.clone()
    _, clipfrac, ppo_kl, lower = compute_gspo_policy_loss(old, log_prob, advantages, mask, 3e-4, 4e-4)
    assert ppo_kl.item() == 0.0 and clipfrac.item() == 0.0 and lower.item() == 0.0


# ---- value loss --------------------------------------------------------------------


def test_value_loss_by_hand():
    # cliprange 0.1; token 2 is padding
    #   t0: vpred 1.0, value 0.8 -> clipped vpred 0.9; ret 1.5: (1-1.5)^2 = .25 vs (0.9-1.5)^2 = .36 -> .36, clipped
    #   t1: vpred 2.0, value 2.05 -> inside [1.95, 2.15]; ret 0: 4 vs 4 -> 4, not clipped (strict >)
    # vf_loss = 0.5 * (0.36 + 4) / 2 = 1.09; clipfrac 1/2
    vpreds = t([[1.0, 2.0, 0.0]], requires_grad=True)
    returns = t([[1.5, 0.0, 5.0]])
    values = t([[0.8, 2.05, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.1)
    assert vf_loss.item() == pytest.approx(1.09, abs=1e-12)
    assert vf_clipfrac.item() == 0.5
    # t0's loss is the clipped branch (constant in vpred) -> 0; t1: 0.5 * 2 * (2 - 0) / 2 = 1
    vf_loss.backward()
    torch.testing.assert_close(vpreds.grad, t([[0.0, 1.0, 0.0]]), rtol=0, atol=1e-12)
    # seq-mean-token-sum of the same matrix: 0.5 * (0.36 + 4) / 1 row
    vf_loss, _ = compute_value_loss(vpreds, returns, values, mask, 0.1, loss_agg_mode="seq-mean-token-sum")
    assert vf_loss.item() == pytest.approx(2.18, abs=1e-12)


# ---- entropy, KL loss, TIS ----------------------------------------------------------


def test_entropy_by_hand():
    # uniform over 2 -> ln 2; uniform over 4 -> ln 4; p = [1/4, 3/4] -> -(1/4 ln 1/4 + 3/4 ln 3/4)
    assert compute_entropy_from_logits(torch.zeros(2)).item() == pytest.approx(math.log(2), abs=1e-6)
    assert compute_entropy_from_logits(torch.zeros(3, 5, 4)).shape == (3, 5)
    assert compute_entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4), abs=1e-6)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert compute_entropy_from_logits(torch.tensor([0.0, math.log(3)])).item() == pytest.approx(h, abs=1e-6)
    # stable for huge logits, fp32 out of bf16 in
    big = torch.tensor([1000.0, 1000.0], dtype=torch.bfloat16)
    out = compute_entropy_from_logits(big)
    assert out.dtype == torch.float32 and out.item() == pytest.approx(math.log(2), abs=1e-6)


def test_entropy_with_masked_vocab_has_finite_gradient():
    # -inf logit has p = 0 and contributes 0: entropy of [0, -inf, 0] is ln 2
    logits = torch.tensor([0.0, -math.inf, 0.0], requires_grad=True)
    h = compute_entropy_from_logits(logits)
    assert h.item() == pytest.approx(math.log(2), abs=1e-6)
    h.backward()
    assert torch.isfinite(logits.grad).all()


def test_kl_loss_by_hand():
    # d = logp - ref on real tokens = [0.5, -1]; third token is padding
    #   k1 token-mean: (0.5 - 1) / 2 = -0.25;   k1 seq-mean-token-sum: -0.5
    #   k3: ((e^-0.5 - 0.5) + (e - 2)) / 2
    logp = t([[-1.0, -2.0, 0.0]])
    ref = t([[-1.5, -1.0, 99.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert kl_loss(logp, ref, mask, "k1", "token-mean").item() == pytest.approx(-0.25, abs=1e-12)
    assert kl_loss(logp, ref, mask, "kl", "seq-mean-token-sum").item() == pytest.approx(-0.5, abs=1e-12)
    k3 = ((math.exp(-0.5) - 0.5) + (math.e - 2)) / 2
    assert kl_loss(logp, ref, mask, "low_var_kl", "token-mean").item() == pytest.approx(k3, abs=1e-12)
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_loss(logp, ref, mask, "k4", "token-mean")


def test_truncated_is_weights_by_hand():
    # exp(old - rollout): exp(0.5) = 1.6487 -> capped at 1.5; exp(-0.5) = 0.6065; padding -> 0
    old = t([[-1.0, -1.0, -1.0]], requires_grad=True)
    rollout = t([[-1.5, -0.5, -1.0]])
    w = compute_truncated_is_weights(old, rollout, torch.tensor([[1, 1, 0]]), cap=1.5)
    torch.testing.assert_close(w, t([[1.5, math.exp(-0.5), 0.0]]), rtol=0, atol=1e-12)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        compute_truncated_is_weights(old, rollout, torch.tensor([[1, 1, 0]]), cap=0.0)
