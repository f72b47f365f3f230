"""Hand-worked tests for tandem.algos.kl."""

import math

import pytest
import torch

from tandem.algos.kl import (
    KL_PENALTY_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
)

F64 = torch.float64

# log_prob - ref_log_prob = d = [0.5, -1.0]
LOGP = torch.tensor([[-1.0, -2.0]], dtype=F64)
REF = torch.tensor([[-1.5, -1.0]], dtype=F64)


def test_kl_estimators_by_hand():
    # k1: d = [0.5, -1];  abs: [0.5, 1];  k2: 0.5 d^2 = [0.125, 0.5]
    # k3: with x = ref - logp = [-0.5, 1]: exp(x) - x - 1 = [e^-0.5 - 0.5, e - 2]
    k3 = [math.exp(-0.5) - 0.5, math.e - 2]
    expected = {
        "kl": [0.5, -1.0], "k1": [0.5, -1.0], "abs": [0.5, 1.0], "mse": [0.125, 0.5], "k2": [0.125, 0.5],
        "low_var_kl": k3, "k3": k3,
    }  # fmt: skip
    assert set(expected) == set(KL_PENALTY_TYPES)
    for name, value in expected.items():
        out = kl_penalty(LOGP, REF, name)
        assert out.shape == (1, 2)
        torch.testing.assert_close(out, torch.tensor([value], dtype=F64), rtol=0, atol=1e-12, msg=name)


def test_k3_is_clamped_like_verl():
    # x = ref - logp = -30 -> clamped to -20: e^-20 + 20 - 1 ~ 19 -> clamped to 10
    # x = +30 -> clamped to 20: e^20 - 21 -> clamped to 10;  x = 0 -> exactly 0
    logp = torch.zeros(1, 3, dtype=F64)
    ref = torch.tensor([[-30.0, 30.0, 0.0]], dtype=F64)
    assert kl_penalty(logp, ref, "k3").tolist() == [[10.0, 10.0, 0.0]]


def test_kl_penalty_unknown_lists_known():
    with pytest.raises(ValueError) as err:
        kl_penalty(LOGP, REF, "full")
    for name in KL_PENALTY_TYPES:
        assert repr(name) in str(err.value)


def test_adaptive_controller_two_steps_by_hand():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=100)
    # step 1: kl 1.5 -> error clip(1.5/1 - 1) = clip(0.5) = 0.2; mult 1 + 0.2 * 10 / 100 = 1.02 -> 0.102
    ctrl.update(current_kl=1.5, n_steps=10)
    assert ctrl.value == pytest.approx(0.102, abs=1e-15)
    # step 2: kl 0.9 -> error -0.1 (inside the clip); mult 1 - 0.1 * 20 / 100 = 0.98 -> 0.09996
    ctrl.update(current_kl=0.9, n_steps=20)
    assert ctrl.value == pytest.approx(0.102 * 0.98, abs=1e-15)
    # state round trip
    other = AdaptiveKLController(init_kl_coef=5.0, target_kl=1.0, horizon=100)
    other.load_state_dict(ctrl.state_dict())
    assert other.value == ctrl.value


def test_adaptive_controller_lower_clip():
    # kl 0 -> error clip(-1) = -0.2; mult 1 - 0.2 * 50 / 100 = 0.9
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.5, horizon=100)
    ctrl.update(current_kl=0.0, n_steps=50)
    assert ctrl.value == pytest.approx(0.18, abs=1e-15)


def test_fixed_controller_and_factory():
    ctrl = FixedKLController(kl_coef=0.05)
    ctrl.update(current_kl=123.0, n_steps=1000)
    assert ctrl.value == 0.05
    restored = FixedKLController(kl_coef=0.0)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.value == 0.05
    assert isinstance(get_kl_controller("fixed", 0.1), FixedKLController)
    adaptive = get_kl_controller("adaptive", 0.1, target_kl=6.0, horizon=10000)
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.1
    with pytest.raises(ValueError, match="fixed"):
        get_kl_controller("pid", 0.1)


def test_apply_kl_penalty_by_hand():
    # k1 on real tokens: row 0 d = [0.5, 0, 0], row 1 d = [0, -1, (7: padding)]
    # beta = 0.1: rewards = scores - 0.1 * d * mask
    #   row 0: [0 - 0.05, 0, 1] ; row 1: [0, 2 + 0.1, 0]
    # current_kl: row means 0.5/3 = 1/6 and -1/2 -> mean (1/6 - 1/2) / 2 = -1/6
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=F64)
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]], dtype=F64)
    ref = torch.tensor([[-1.5, -1.0, -1.0], [-2.0, -1.0, -9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=1.0, horizon=10)
    rewards, out = apply_kl_penalty(scores, old, ref, mask, ctrl, kl_penalty="kl")
    expected = torch.tensor([[-0.05, 0.0, 1.0], [0.0, 2.1, 0.0]], dtype=F64)
    torch.testing.assert_close(rewards, expected, rtol=0, atol=1e-12)
    assert set(out) == {"actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"}
    assert isinstance(out["actor/reward_kl_penalty"], float)
    assert out["actor/reward_kl_penalty"] == pytest.approx(-1 / 6, abs=1e-12)
    assert out["actor/reward_kl_penalty_coeff"] == 0.1
    assert ctrl.value == 0.1  # not updated by apply_kl_penalty

    # a third row with no real token leaves current_kl unchanged
    pad = torch.zeros(1, 3, dtype=F64)
    _, out3 = apply_kl_penalty(
        torch.cat([scores, pad]), torch.cat([old, pad]), torch.cat([ref, pad - 5]),
        torch.cat([mask, torch.zeros(1, 3, dtype=mask.dtype)]), ctrl,
    )  # fmt: skip
    assert out3["actor/reward_kl_penalty"] == pytest.approx(-1 / 6, abs=1e-12)
