"""Hand-worked and reference-loop tests for tandem.algos.advantages."""

import math
import random

import pytest
import torch

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
)

F64 = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=F64)


def whiten_by_hand(xs):
    """(x - mean) / sqrt(unbiased var + 1e-8) over a plain list."""
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


# ---- GAE ---------------------------------------------------------------------------

# gamma = 0.9, lam = 0.8 (gamma * lam = 0.72)
# row 0: mask [1, 1, 0], rewards [0, 1, pad], values [0.5, 0.2, pad]
#   t=1 (last real, terminal): delta = 1 - 0.2 = 0.8                  A1 = 0.8
#   t=0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32;  A0 = -0.32 + 0.72 * 0.8 = 0.256
#   returns = A + V = [0.756, 1.0, 0]
# row 1: mask [1, 1, 1], rewards [0, 0, 2], values [1, 1, 1]
#   t=2: delta = 2 - 1 = 1                                            A2 = 1
#   t=1: delta = 0.9 - 1 = -0.1;   A1 = -0.1 + 0.72 * 1    = 0.62
#   t=0: delta = -0.1;             A0 = -0.1 + 0.72 * 0.62 = 0.3464
#   returns = [1.3464, 1.62, 2.0]
GAE_RAW = [0.256, 0.8, 0.3464, 0.62, 1.0]  # unwhitened advantages on real tokens, row-major


def test_gae_by_hand():
    rewards = t([[0.0, 1.0, 5.0], [0.0, 0.0, 2.0]])
    values = t([[0.5, 0.2, 9.0], [1.0, 1.0, 1.0]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(ret, t([[0.756, 1.0, 0.0], [1.3464, 1.62, 2.0]]), rtol=0, atol=1e-12)
    w = whiten_by_hand(GAE_RAW)
    torch.testing.assert_close(adv, t([[w[0], w[1], 0.0], [w[2], w[3], w[4]]]), rtol=0, atol=1e-9)


def test_gae_padding_does_not_leak_even_nan():
    # same row 0 as above with NaN rewards/values in the padding: the pad value must
    # not bootstrap into the last real token, and nothing NaN may come out.
    rewards = t([[0.0, 1.0, float("nan")], [0.0, 0.0, 2.0]])
    values = t([[0.5, 0.2, float("nan")], [1.0, 1.0, 1.0]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    torch.testing.assert_close(ret[0], t([0.756, 1.0, 0.0]), rtol=0, atol=1e-12)


def test_gae_skips_interior_masked_tokens():
    # mask [1, 0, 1]: the middle token (e.g. a tool observation) is skipped, so the
    # real tokens behave exactly like row 0 of the hand example: A = [0.256, -, 0.8]
    rewards = t([[0.0, 7.0, 1.0], [0.0, 0.0, 2.0]])
    values = t([[0.5, 9.0, 0.2], [1.0, 1.0, 1.0]])
    mask = t([[1, 0, 1], [1, 1, 1]])
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(ret[0], t([0.756, 0.0, 1.0]), rtol=0, atol=1e-12)
    w = whiten_by_hand(GAE_RAW)
    torch.testing.assert_close(adv[0], t([w[0], 0.0, w[1]]), rtol=0, atol=1e-9)


def reference_gae(rewards, values, lengths, gamma, lam):
    """Plain double loop over rows and (reversed) time for right-padded rows."""
    batch, resp_len = len(rewards), len(rewards[0])
    adv = [[0.0] * resp_len for _ in range(batch)]
    ret = [[0.0] * resp_len for _ in range(batch)]
    for i in range(batch):
        last = 0.0
        for step in reversed(range(lengths[i])):
            next_value = values[i][step + 1] if step + 1 < lengths[i] else 0.0
            delta = rewards[i][step] + gamma * next_value - values[i][step]
            last = delta + gamma * lam * last
            adv[i][step] = last
            ret[i][step] = last + values[i][step]
    flat = [adv[i][s] for i in range(batch) for s in range(lengths[i])]
    white = iter(whiten_by_hand(flat))
    adv = [[next(white) if s < lengths[i] else 0.0 for s in range(resp_len)] for i in range(batch)]
    return adv, ret


@pytest.mark.parametrize("seed", range(6))
def test_gae_matches_reference_loop(seed):
    rng = random.Random(seed)
    batch, resp_len = 5, 9
    gamma, lam = rng.choice([(0.99, 0.95), (0.9, 0.7), (0.8, 1.0)])
    lengths = [rng.randint(1, resp_len) for _ in range(batch)]
    rewards = [[rng.gauss(0, 1) for _ in range(resp_len)] for _ in range(batch)]  # padding holds junk too
    values = [[rng.gauss(0, 1) for _ in range(resp_len)] for _ in range(batch)]
    mask = t([[1.0 if s < n else 0.0 for s in range(resp_len)] for n in lengths])
    adv, ret = compute_gae_advantage_return(t(rewards), t(values), mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = reference_gae(rewards, values, lengths, gamma, lam)
    torch.testing.assert_close(ret, t(ref_ret), rtol=0, atol=1e-10)
    torch.testing.assert_close(adv, t(ref_adv), rtol=0, atol=1e-8)
    # float32 with a bool mask gives the same up to float32 rounding
    adv32, ret32 = compute_gae_advantage_return(t(rewards).float(), t(values).float(), mask.bool(), gamma, lam)
    assert adv32.dtype == torch.float32
    torch.testing.assert_close(ret32, t(ref_ret).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv32, t(ref_adv).float(), rtol=1e-4, atol=1e-4)


# ---- group estimators --------------------------------------------------------------

# 6 rows, R = 3, reward on each row's last real token.
#   group "p0": rows 0, 1, 2 with scores 1, 0, 0
#   group "p1": row 3 alone with score 2
#   group "p2": rows 4, 5 with scores 3, 5
GROUP_MASK = t([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]])
GROUP_REWARDS = t([[0, 0, 1], [0, 0, 7], [0, 9, 9], [0, 0, 2], [0, 3, -4], [0, 0, 5]])  # 7, 9, -4 are padding
GROUP_INDEX_STR = ["p0", "p0", "p0", "p1", "p2", "p2"]
GROUP_INDEX_LONG = torch.tensor([10, 10, 10, 7, 3, 3])


def broadcast(per_row):
    return t(per_row).unsqueeze(-1) * GROUP_MASK


def test_grpo_by_hand():
    eps = 1e-6
    # p0: mean 1/3; deviations 2/3, -1/3, -1/3; unbiased var (4/9 + 1/9 + 1/9) / 2 = 1/3
    s0 = math.sqrt(1 / 3)
    # p1: single row -> mean 0, std 1 (verl) -> 2 / (1 + eps)
    # p2: mean 4, deviations -1, +1, unbiased var 2
    s2 = math.sqrt(2)
    expected = broadcast([(2 / 3) / (s0 + eps), (-1 / 3) / (s0 + eps), (-1 / 3) / (s0 + eps),
                          2 / (1 + eps), -1 / (s2 + eps), 1 / (s2 + eps)])  # fmt: skip
    for index in (GROUP_INDEX_STR, GROUP_INDEX_LONG):
        adv, ret = compute_grpo_outcome_advantage(GROUP_REWARDS, GROUP_MASK, index, epsilon=eps)
        torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)
        assert ret is adv or torch.equal(ret, adv)


def test_grpo_without_std_normalisation():
    # Dr.GRPO: score - group mean (single row: mean 0)
    adv, _ = compute_grpo_outcome_advantage(GROUP_REWARDS, GROUP_MASK, GROUP_INDEX_STR, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv, broadcast([2 / 3, -1 / 3, -1 / 3, 2, -1, 1]), rtol=0, atol=1e-12)


def test_grpo_index_length_mismatch_raises():
    with pytest.raises(ValueError, match="index"):
        compute_grpo_outcome_advantage(GROUP_REWARDS, GROUP_MASK, GROUP_INDEX_STR[:-1])


def test_rloo_by_hand():
    # A_i = score_i - mean of the other rows of the group; a single row keeps its score
    # p0: 1 - (0+0)/2 = 1; 0 - (1+0)/2 = -0.5 (twice);  p1: 2;  p2: 3 - 5 = -2, 5 - 3 = 2
    for index in (GROUP_INDEX_STR, GROUP_INDEX_LONG):
        adv, ret = compute_rloo_outcome_advantage(GROUP_REWARDS, GROUP_MASK, index)
        torch.testing.assert_close(adv, broadcast([1, -0.5, -0.5, 2, -2, 2]), rtol=0, atol=1e-12)
        assert torch.equal(ret, adv)


def test_reinforce_plus_plus_by_hand():
    # gamma = 0.5
    # row 0: mask [1,1,1], rewards [1,0,2] -> G = [1 + 0.5*1, 0 + 0.5*2, 2] = [1.5, 1, 2]
    # row 1: mask [1,1,0], rewards [0,1,pad 4] -> the pad is cut: G = [0.5, 1, 0]
    # whiten over [1.5, 1, 2, 0.5, 1]: mean 1.2, squares .09+.04+.64+.49+.04 = 1.3, var 1.3/4 = .325
    rewards = t([[1.0, 0.0, 2.0], [0.0, 1.0, 4.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    torch.testing.assert_close(ret, t([[1.5, 1.0, 2.0], [0.5, 1.0, 0.0]]), rtol=0, atol=1e-12)
    s = math.sqrt(0.325 + 1e-8)
    expected = t([[0.3 / s, -0.2 / s, 0.8 / s], [-0.7 / s, -0.2 / s, 0.0]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)


def test_reinforce_plus_plus_baseline_by_hand():
    # rows 0,1 in group 0 (scores 1, 3: mean 2 -> -1, +1); row 2 alone (mean 0 -> 2)
    # tokens: row 0 [-1, -1], row 1 [1, pad], row 2 [2, 2]
    # whiten over [-1, -1, 1, 2, 2]: mean 0.6, squares 2.56*2 + .16 + 1.96*2 = 9.2, var 9.2/4 = 2.3
    rewards = t([[0.0, 1.0], [3.0, 9.0], [0.0, 2.0]])
    mask = t([[1, 1], [1, 0], [1, 1]])
    adv, ret = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, torch.tensor([0, 0, 1]))
    s = math.sqrt(2.3 + 1e-8)
    expected = t([[-1.6 / s, -1.6 / s], [0.4 / s, 0.0], [1.4 / s, 1.4 / s]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)
    assert torch.equal(ret, adv)


def test_remax_by_hand():
    # returns-to-go (undiscounted): row 0 [0+1+2, 1+2, 2] = [3, 3, 2]; row 1 [3+0, 0, pad] = [3, 0, 0]
    # advantages = returns - baseline on real tokens: row 0 - 1.5, row 1 - 1
    rewards = t([[0.0, 1.0, 2.0], [3.0, 0.0, 9.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_remax_outcome_advantage(rewards, t([1.5, 1.0]), mask)
    torch.testing.assert_close(ret, t([[3.0, 3.0, 2.0], [3.0, 0.0, 0.0]]), rtol=0, atol=0)
    torch.testing.assert_close(adv, t([[1.5, 1.5, 0.5], [2.0, -1.0, 0.0]]), rtol=0, atol=0)


# ---- registry ----------------------------------------------------------------------


def test_registry_names_and_lookup():
    names = {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"}
    assert set(ADV_ESTIMATORS) == names
    assert get_adv_estimator("grpo") is compute_grpo_outcome_advantage
    assert get_adv_estimator("gae") is compute_gae_advantage_return


def test_registry_unknown_name_lists_known():
    with pytest.raises(ValueError) as err:
        get_adv_estimator("ppo")
    for name in ADV_ESTIMATORS:
        assert name in str(err.value)


def test_registry_duplicate_raises():
    with pytest.raises(ValueError, match="already registered"):
        register_adv_estimator("grpo")(lambda **_: None)
    assert ADV_ESTIMATORS["grpo"] is compute_grpo_outcome_advantage


def test_compute_advantage_passes_only_accepted_inputs():
    columns = dict(
        token_level_rewards=GROUP_REWARDS, response_mask=GROUP_MASK, index=GROUP_INDEX_STR,
        values=torch.zeros_like(GROUP_REWARDS), gamma=1.0, lam=1.0, reward_baselines=torch.zeros(6, dtype=F64),
    )  # fmt: skip
    adv, _ = compute_advantage("rloo", **columns)
    torch.testing.assert_close(adv, broadcast([1, -0.5, -0.5, 2, -2, 2]), rtol=0, atol=1e-12)
    # remax with zero baselines: advantages are the returns-to-go
    adv, ret = compute_advantage("remax", **columns)
    assert torch.equal(adv, ret)
