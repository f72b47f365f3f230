"""Hand-worked tests for tandem.algos.aggregate (masked reductions, agg_loss) and tandem.algos.metrics."""

import math

import pytest
import torch

from tandem.algos import metrics
from tandem.algos.aggregate import (
    LOSS_AGG_MODES,
    agg_loss,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

# The running example: 2 rows x 3 tokens; row 0 has 2 real tokens, row 1 has 1.
VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.float64)


def test_masked_sum_and_mean_by_hand():
    # kept: 1, 2 | 4  -> total 7 over 3 tokens; per row 3 (2 tokens) and 4 (1 token)
    assert masked_sum(VALUES, MASK).item() == 7.0
    assert masked_sum(VALUES, MASK, dim=-1).tolist() == [3.0, 4.0]
    assert masked_mean(VALUES, MASK).item() == pytest.approx(7 / 3, abs=1e-15)
    assert masked_mean(VALUES, MASK, dim=-1).tolist() == [1.5, 4.0]
    # bool mask gives the same
    assert masked_mean(VALUES, MASK.bool(), dim=-1).tolist() == [1.5, 4.0]


def test_masked_reductions_ignore_nan_in_padding_and_empty_rows():
    values = VALUES.clone()
    values[0, 2] = float("nan")
    values[1, 1] = float("inf")
    assert masked_sum(values, MASK).item() == 7.0
    # a row with no real token: mean 0, not NaN
    empty = torch.zeros_like(MASK)
    assert masked_mean(values, empty, dim=-1).tolist() == [0.0, 0.0]
    assert masked_mean(values, empty).item() == 0.0


def test_masked_mean_float_weights():
    # weights 0.5 and 1 on values 2 and 4: sum 0.5*2 + 4 = 5, weight 1.5 -> 10/3
    values = torch.tensor([2.0, 4.0, 100.0], dtype=torch.float64)
    weights = torch.tensor([0.5, 1.0, 0.0], dtype=torch.float64)
    assert masked_sum(values, weights).item() == 5.0
    assert masked_mean(values, weights).item() == pytest.approx(10 / 3, abs=1e-15)


def test_masked_var_by_hand():
    # kept 1, 2, 4: mean 7/3, deviations -4/3, -1/3, 5/3, squares sum 42/9 = 14/3
    # biased 14/9, unbiased (n-1 = 2) 7/3
    assert masked_var(VALUES, MASK).item() == pytest.approx(7 / 3, abs=1e-12)
    assert masked_var(VALUES, MASK, unbiased=False).item() == pytest.approx(14 / 9, abs=1e-12)


def test_masked_var_rejects_empty_and_single():
    with pytest.raises(ValueError, match="no element"):
        masked_var(VALUES, torch.zeros_like(MASK))
    one = torch.zeros_like(MASK)
    one[0, 0] = 1
    with pytest.raises(ValueError, match="one element"):
        masked_var(VALUES, one)
    assert masked_var(VALUES, one, unbiased=False).item() == 0.0


def test_masked_whiten_by_hand():
    # kept [1, 3]: mean 2, unbiased var ((1)^2 + (1)^2) / 1 = 2 -> [-1, 1] / sqrt(2)
    values = torch.tensor([[1.0, 3.0, 50.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.float64)
    s = math.sqrt(2 + 1e-8)
    out = masked_whiten(values, mask)
    assert out[0, :2].tolist() == pytest.approx([-1 / s, 1 / s], abs=1e-12)
    # shift_mean=False adds the mean (2) back
    out = masked_whiten(values, mask, shift_mean=False)
    assert out[0, :2].tolist() == pytest.approx([2 - 1 / s, 2 + 1 / s], abs=1e-12)


def test_agg_loss_each_mode_by_hand():
    # loss_mat = VALUES, mask = MASK (B=2, R=3):
    #   token-mean:               (1 + 2 + 4) / 3          = 7/3
    #   seq-mean-token-sum:       mean(3, 4)               = 3.5
    #   seq-mean-token-mean:      mean(3/2, 4/1)           = 2.75
    #   seq-mean-token-sum-norm:  7 / (B * R) = 7 / 6
    expected = {
        "token-mean": 7 / 3,
        "seq-mean-token-sum": 3.5,
        "seq-mean-token-mean": 2.75,
        "seq-mean-token-sum-norm": 7 / 6,
    }
    assert set(expected) == set(LOSS_AGG_MODES)
    for mode, value in expected.items():
        assert agg_loss(VALUES, MASK, mode).item() == pytest.approx(value, abs=1e-12), mode


def test_agg_loss_excludes_empty_rows_and_never_nans():
    # add a third row with no real token; its 7, 8, 9 must not count
    values = torch.cat([VALUES, torch.tensor([[7.0, 8.0, 9.0]], dtype=torch.float64)])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=torch.float64)])
    assert agg_loss(values, mask, "token-mean").item() == pytest.approx(7 / 3)
    assert agg_loss(values, mask, "seq-mean-token-sum").item() == pytest.approx(3.5)  # over the 2 non-empty rows
    assert agg_loss(values, mask, "seq-mean-token-mean").item() == pytest.approx(2.75)
    assert agg_loss(values, mask, "seq-mean-token-sum-norm").item() == pytest.approx(7 / 9)  # B*R = 3*3
    nothing = torch.zeros_like(mask)
    for mode in LOSS_AGG_MODES:
        assert agg_loss(values, nothing, mode).item() == 0.0, mode


def test_agg_loss_gradient_token_mean():
    # d(token-mean)/d loss_mat = mask / 3
    loss_mat = VALUES.clone().requires_grad_(True)
    agg_loss(loss_mat, MASK, "token-mean").backward()
    expected = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64) / 3
    torch.testing.assert_close(loss_mat.grad, expected, rtol=0, atol=1e-15)


def test_agg_loss_unknown_mode_lists_known():
    with pytest.raises(ValueError) as err:
        agg_loss(VALUES, MASK, "token-sum")
    for mode in LOSS_AGG_MODES:
        assert mode in str(err.value)


# ---- metrics ---------------------------------------------------------------------


def test_metric_names_are_verl_names_and_all_defined():
    assert metrics.ACTOR_PG_LOSS == "actor/pg_loss"
    assert metrics.ACTOR_PPO_KL == "actor/ppo_kl"
    assert metrics.ACTOR_PG_CLIPFRAC == "actor/pg_clipfrac"
    assert metrics.ACTOR_PG_CLIPFRAC_LOWER == "actor/pg_clipfrac_lower"
    assert metrics.ACTOR_ENTROPY == "actor/entropy"
    assert metrics.ACTOR_KL_LOSS == "actor/kl_loss"
    assert metrics.ACTOR_GRAD_NORM == "actor/grad_norm"
    assert metrics.ACTOR_LR == "actor/lr"
    assert metrics.CRITIC_VF_LOSS == "critic/vf_loss"
    assert metrics.CRITIC_VF_CLIPFRAC == "critic/vf_clipfrac"
    assert metrics.CRITIC_VPRED_MEAN == "critic/vpred_mean"
    assert metrics.CRITIC_GRAD_NORM == "critic/grad_norm"
    for name in (
        "critic/score/mean", "critic/rewards/mean", "critic/advantages/mean", "critic/returns/mean",
        "critic/values/mean", "critic/vf_explained_var", "response_length/mean", "response_length/max",
        "response_length/clip_ratio", "prompt_length/mean", "timing_s/gen", "timing_s/reward",
        "timing_s/old_log_prob", "timing_s/ref", "timing_s/values", "timing_s/adv", "timing_s/update_critic",
        "timing_s/update_actor", "timing_s/step", "perf/throughput", "val/accuracy",
    ):  # fmt: skip
        assert name in metrics.DEFINITIONS, name
    constants = {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(metrics.DEFINITIONS)
    assert all(metrics.DEFINITIONS[name].strip() for name in constants)


def test_explained_variance_by_hand():
    # real tokens: returns [1, 2, 3], values [1, 2, 2] -> diff [0, 0, 1]
    # Var(diff) unbiased: mean 1/3, squares 1/9 + 1/9 + 4/9 = 6/9, / 2 = 1/3; Var(returns) = 1
    returns = torch.tensor([[1.0, 2.0, 3.0, 40.0]])
    values = torch.tensor([[1.0, 2.0, 2.0, -7.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert metrics.explained_variance(values, returns, mask) == pytest.approx(1 - (1 / 3) / (1 + 1e-5), abs=1e-9)
    assert metrics.explained_variance(returns, returns, mask) == 1.0
    assert math.isnan(metrics.explained_variance(values, returns, torch.tensor([[1, 0, 0, 0]])))


def _data_batch():
    return {
        "response_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
        "token_level_scores": torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]]),  # row sums 1, 0.5
        "token_level_rewards": torch.tensor([[-0.1, 0.0, 1.0], [0.5, 9.0, 9.0]]),  # row sums 0.9, 0.5 (9s are padding)
        "advantages": torch.tensor([[1.0, 2.0, 3.0], [-1.0, 100.0, 100.0]]),  # real: 1, 2, 3, -1
        "returns": torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, 0.0]]),  # real: 1, 1, 1, 2
        "values": torch.tensor([[1.0, 1.0, 0.0], [2.0, 0.0, 0.0]]),  # real: 1, 1, 0, 2
        "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),  # prompt lengths 2, 3 (left padded)
    }


def test_compute_data_metrics_by_hand():
    out = metrics.compute_data_metrics(_data_batch(), use_critic=True)
    # returns - values on real tokens = [0, 0, 1, 0]: mean 1/4, unbiased var (3/16 + 9/16) / 3 = 1/4
    # returns [1, 1, 1, 2]: mean 5/4, unbiased var likewise 1/4
    expected = {
        "critic/score/mean": 0.75, "critic/score/max": 1.0, "critic/score/min": 0.5,
        "critic/rewards/mean": 0.7, "critic/rewards/max": 0.9, "critic/rewards/min": 0.5,
        "critic/advantages/mean": 1.25, "critic/advantages/max": 3.0, "critic/advantages/min": -1.0,
        "critic/returns/mean": 1.25, "critic/returns/max": 2.0, "critic/returns/min": 1.0,
        "critic/values/mean": 1.0, "critic/values/max": 2.0, "critic/values/min": 0.0,
        "critic/vf_explained_var": 1 - 0.25 / (0.25 + 1e-5),
        "response_length/mean": 2.0, "response_length/max": 3.0, "response_length/min": 1.0,
        "response_length/clip_ratio": 0.5,  # row 0 used all R = 3 tokens
        "prompt_length/mean": 2.5, "prompt_length/max": 3.0, "prompt_length/min": 2.0,
        "prompt_length/clip_ratio": 0.5,  # row 1 used all P = 3 tokens
    }  # fmt: skip
    assert set(out) == set(expected)
    for key, value in expected.items():
        assert out[key] == pytest.approx(value, abs=1e-6), key
        assert isinstance(out[key], float)


def test_compute_data_metrics_without_critic_and_with_prompt_lengths():
    batch = _data_batch()
    del batch["values"], batch["prompt_mask"]
    batch["prompt_length"] = torch.tensor([4, 6])
    out = metrics.compute_data_metrics(batch, use_critic=False, max_response_length=4)
    assert not any(key.startswith("critic/values") for key in out)
    assert "critic/vf_explained_var" not in out
    assert out["response_length/clip_ratio"] == 0.0  # neither row reached 4
    assert out["prompt_length/mean"] == 5.0
    assert "prompt_length/clip_ratio" not in out  # no max_prompt_length known
    # a multi-turn row's length counts its observations (verl's attention mask), not only its loss tokens
    batch["response_length"] = torch.tensor([4, 2])
    longer = metrics.compute_data_metrics(batch, use_critic=False, max_response_length=4)
    assert longer["response_length/max"] == 4.0 and longer["response_length/clip_ratio"] == 0.5
    assert longer["critic/score/mean"] == out["critic/score/mean"]  # the masks of the rest are unchanged
