"""Hand-worked tests for tandem.algos.dapo (overlong penalty, dynamic-sampling filter) and
the per-token TIS weights inside the policy losses."""
import math

import pytest
import torch

from tandem.algos.dapo import compute_overlong_penalty, varied_group_mask
from tandem.algos.losses import (
    compute_gspo_policy_loss,
    compute_policy_loss,
    compute_truncated_is_weights,
)


def test_overlong_penalty_by_hand():
    # L_max = 10, buffer 4 -> expected length 6; penalty = min(-(len - 6) / 4 * 0.5, 0)
    lengths = torch.tensor([3, 6, 7, 8, 10])
    got = compute_overlong_penalty(lengths, max_response_length=10, buffer_len=4, penalty_factor=0.5)
    #        3 and 6: not over -> 0;  7: -1/4*0.5 = -0.125;  8: -0.25;  10 (the limit): -0.5
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5]))


def test_overlong_penalty_builtin_task_setting():
    # deploy/configs/arithmetic_dapo.yaml: L_max 6, buffer 1 -> only a 6-token (EOS-less) answer pays 1
    got = compute_overlong_penalty(torch.tensor([2, 5, 6]), 6, 1, 1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -1.0]))


def test_overlong_penalty_bad_buffer():
    with pytest.raises(ValueError, match="buffer_len"):
        compute_overlong_penalty(torch.tensor([1]), 6, 0, 1.0)


def test_varied_group_mask_by_hand():
    # groups (n=3): [1,1,1] all equal -> drop; [0,1,0] -> keep; [0,0,0] -> drop; a lone row -> keep (verl)
    values = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5])
    index = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3])
    assert varied_group_mask(values, index).tolist() == [False] * 3 + [True] * 3 + [False] * 3 + [True]


def test_varied_group_mask_string_uids():
    assert varied_group_mask(torch.tensor([0.2, 0.2, 0.2, 0.3]), ["a", "a", "b", "b"]).tolist() == [
        False, False, True, True]


# ---- truncated IS inside the policy losses ------------------------------------------


def test_policy_loss_with_is_weights_by_hand():
    # on-policy (ratio 1, no clipping): per-token loss = -A; with weights w: -A * w.
    # A = [2, -1, 4], w = [0.5, 2, 1], mask = [1, 1, 0]
    # token-mean over the two kept tokens: (-2*0.5 + 1*2) / 2 = 0.5   (the masked 4 does not count)
    lp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w = torch.tensor([[0.5, 2.0, 1.0]])
    loss, clipfrac, ppo_kl, _ = compute_policy_loss(lp.detach(), lp, adv, mask, is_weights=w)
    assert loss.item() == pytest.approx(0.5)
    assert clipfrac.item() == 0.0 and ppo_kl.item() == 0.0
    # d loss / d log_prob_t = -A_t * w_t * ratio / 2 = [-0.5, 1.0, 0]
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-0.5, 1.0, 0.0]]))
    # without weights the same batch gives (-2 + 1) / 2 = -0.5
    assert compute_policy_loss(lp.detach(), lp.detach(), adv, mask)[0].item() == pytest.approx(-0.5)


def test_policy_loss_is_weights_apply_after_clipping():
    # ratio 1.5 with A = 1 and clip 0.2: clipped loss -1.2; weight 0.5 -> -0.6 (seq-mean-token-sum)
    old = torch.tensor([[0.0]])
    lp = torch.tensor([[math.log(1.5)]])
    loss, clipfrac, _, _ = compute_policy_loss(old, lp, torch.tensor([[1.0]]), torch.tensor([[1.0]]),
                                               loss_agg_mode="seq-mean-token-sum",
                                               is_weights=torch.tensor([[0.5]]))
    assert loss.item() == pytest.approx(-0.6) and clipfrac.item() == 1.0


def test_gspo_loss_with_is_weights_by_hand():
    # on-policy: sequence ratio 1, loss per token -A; weights [1, 3] on one row with A = 1:
    # seq-mean-token-mean = mean(-1*1, -1*3) = -2
    lp = torch.tensor([[-1.0, -2.0]])
    loss, *_ = compute_gspo_policy_loss(lp, lp, torch.tensor([[1.0, 1.0]]), torch.tensor([[1.0, 1.0]]),
                                        3e-4, 4e-4, is_weights=torch.tensor([[1.0, 3.0]]))
    assert loss.item() == pytest.approx(-2.0)


def test_tis_weights_feed_the_loss():
    # trainer log-prob -1, rollout log-probs [-1, -1 - ln 4]: ratios [1, 4] -> capped at 2 -> [1, 2]
    old = torch.tensor([[-1.0, -1.0]])
    rollout = torch.tensor([[-1.0, -1.0 - math.log(4.0)]])
    mask = torch.ones(1, 2)
    w = compute_truncated_is_weights(old, rollout, mask, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0]]))
    loss, *_ = compute_policy_loss(old, old, torch.tensor([[1.0, 1.0]]), mask, is_weights=w)
    assert loss.item() == pytest.approx(-1.5)  # mean(-1 * 1, -1 * 2)
