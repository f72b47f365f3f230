"""controller/validation.py: verl's validation statistics (mean@N, best@k, worst@k, maj@k)
and metric names, worked by hand on tiny inputs."""
import numpy as np
import pytest

from tandem.controller.validation import (
    _bootstrap_stats,
    bootstrap_metric,
    calc_maj_val,
    extract_pred,
    metric_names,
    process_validation_metrics,
)


def test_calc_maj_val_by_hand():
    data = [{"pred": "A", "val": 0.9}, {"pred": "B", "val": 0.8}, {"pred": "A", "val": 0.7}]
    assert calc_maj_val(data) == 0.9  # "A" has 2 votes; its first value
    # a tie goes to the answer seen first
    assert calc_maj_val([{"pred": "B", "val": 0.0}, {"pred": "A", "val": 1.0}]) == 0.0


def test_extract_pred():
    assert extract_pred("so 12 #### 1,000 ") == "1,000"
    assert extract_pred(" 168") == "168"


def test_process_validation_metrics_by_hand():
    # source a: prompt 0 -> rewards [1, 0], prompt 1 -> [1, 1]; source b: prompt 2 -> [0, 0]
    sources = ["a", "a", "a", "a", "b", "b"]
    uids = [0, 0, 1, 1, 2, 2]
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    preds = ["5", "6", "5", "5", "x", "y"]
    out = process_validation_metrics(sources, uids, {"reward": rewards, "pred": preds})
    a, b = out["a"]["reward"], out["b"]["reward"]
    assert "pred" not in out["a"]  # strings get no statistics
    # mean@2 per prompt: 0.5 and 1.0 -> 0.75; std@2 (population): 0.5 and 0 -> 0.25
    assert a["mean@2"] == pytest.approx(0.75) and a["std@2"] == pytest.approx(0.25)
    # prompt 1 (all ones): best = worst = maj = 1 in every resample; prompt 2 (all zeros): 0
    assert b["best@2/mean"] == b["worst@2/mean"] == b["maj@2/mean"] == b["mean@2"] == 0.0
    # prompt 0 resamples 2 of [1, 0]: best is 1 unless both draws are 0 (p = 3/4), worst 1 only
    # if both are 1 (1/4); so a's best@2 ~ (3/4 + 1) / 2, worst@2 ~ (1/4 + 1) / 2 (1000 resamples)
    assert a["best@2/mean"] == pytest.approx(0.875, abs=0.03)
    assert a["worst@2/mean"] == pytest.approx(0.625, abs=0.03)
    # maj@2 of prompt 0: the first draw wins when the two preds differ, else the common one:
    # value = value of the first draw -> 1 with p 1/2; prompt 1 -> 1: (1/2 + 1) / 2
    assert a["maj@2/mean"] == pytest.approx(0.75, abs=0.03)
    assert set(a) == {"mean@2", "std@2", "best@2/mean", "best@2/std", "worst@2/mean", "worst@2/std",
                      "maj@2/mean", "maj@2/std"}


def test_k_ladder_for_n_8():
    out = process_validation_metrics(["s"] * 8, [0] * 8, {"reward": [0.0, 1.0] * 4})
    names = set(out["s"]["reward"])
    for k in (2, 4, 8):
        assert f"best@{k}/mean" in names and f"worst@{k}/std" in names
    assert "maj@2/mean" not in names  # no "pred" -> no majority vote


def test_vectorised_bootstrap_equals_verl_form():
    vals = [1.0, 0.0, 0.0, 1.0, 0.5]
    preds = ["3", "4", "4", "3", "9"]
    fast = _bootstrap_stats(vals, preds, 4, seed=3)
    [(bm, bs), (wm, ws)] = bootstrap_metric(vals, 4, [max, min], seed=3)
    [(mm, ms)] = bootstrap_metric([{"val": v, "pred": p} for v, p in zip(vals, preds)], 4, [calc_maj_val], seed=3)
    assert fast["best"] == pytest.approx((bm, bs)) and fast["worst"] == pytest.approx((wm, ws))
    assert fast["maj"] == pytest.approx((mm, ms))


def test_metric_names_split_core_and_aux_like_verl():
    processed = {"openai/gsm8k": {"reward": {"mean@4": 0.5, "std@4": 0.1, "best@2/mean": 0.6, "best@4/mean": 0.7,
                                             "maj@4/mean": 0.55, "worst@4/mean": 0.2}}}
    names = metric_names(processed)
    assert names == {
        "val-core/openai/gsm8k/reward/mean@4": 0.5,
        "val-aux/openai/gsm8k/reward/std@4": 0.1,
        "val-aux/openai/gsm8k/reward/best@2/mean": 0.6,  # not the largest N
        "val-core/openai/gsm8k/reward/best@4/mean": 0.7,
        "val-core/openai/gsm8k/reward/maj@4/mean": 0.55,
        "val-aux/openai/gsm8k/reward/worst@4/mean": 0.2,
    }
    # greedy validation (n = 1): only mean@1, in val-core
    greedy = metric_names(process_validation_metrics(["d", "d"], [0, 1], {"reward": [1.0, 0.0]}))
    assert greedy == {"val-core/d/reward/mean@1": 0.5}
    assert np.isfinite(list(greedy.values())).all()
