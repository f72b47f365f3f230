"""Reward faults, with real reward servers that time out, error, crash, come up late or fail
single rows (tests/helpers/faulty_reward_server.py), called through the controller's own client
and controller/reward_calls.py: a deadline per call, bounded retries with backoff for UNAVAILABLE,
and never a silent zero (a failed row is NaN and listed; on_failure=fail raises naming the rows
and reasons, on_failure=drop keeps only whole prompt groups without a failed row)."""
import asyncio
import math
import sys
import time

import pytest
from server_process import ROOT, server_process

from tandem.config import load_config
from tandem.controller.clients import RewardClient
from tandem.controller.reward_calls import RewardFailure, score_rows, settle
from tandem.data.batch import DataProto

SERVER = str(ROOT / "tests" / "helpers" / "faulty_reward_server.py")
# 3 prompt groups of 2 rows; rows 1 ("1...") and 4 ("") fail in the server's `rows` mode
BATCH = DataProto(columns={"response_text": ["7", "12", "8", "9", "", "30"], "ground_truth": ["7"] * 6})


def _cfg(*overrides):
    return load_config(None, ["reward_model.timeout_s=1.5", "reward_model.max_retries=2",
                              "reward_model.retry_backoff_s=0.1", *overrides])


def _score(endpoint, cfg):
    async def main():
        async with RewardClient(endpoint, timeout_s=cfg.reward_model.timeout_s) as client:
            t0 = time.monotonic()
            out = await score_rows(client, BATCH, cfg)
            return out, time.monotonic() - t0
    return asyncio.run(main())


@pytest.fixture
def faulty(tmp_path):
    def start(mode: str):
        return server_process([sys.executable, SERVER, "--port-file", str(tmp_path / f"{mode}.port"), "--fault", mode],
                              tmp_path / f"{mode}.port")
    return start


def _all_failed(scored, fragment):
    assert sorted(scored.failures) == list(range(len(BATCH)))
    assert all(fragment in reason for reason in scored.failures.values()), scored.failures
    assert all(math.isnan(s) for s in scored.scores.tolist())  # no score made up


@pytest.mark.parametrize("mode, fragment", [("timeout", "DEADLINE_EXCEEDED"), ("error", "INTERNAL: Reward.Score"),
                                            ("crash", "UNAVAILABLE after 3 attempts")])
def test_a_failed_call_fails_every_row_and_the_configured_behaviour_follows(faulty, mode, fragment):
    fragment = fragment.replace("Reward.Score", "RewardService.Score: verifier exploded")
    with faulty(mode) as endpoint:
        scored, took = _score(endpoint, _cfg())
    _all_failed(scored, fragment)
    if mode == "timeout":
        assert 1.4 < took < 5  # the deadline, not the server's 30 s sleep
    with pytest.raises(RewardFailure, match=rf"6 of 6 rows could not be scored \(step; reward_model.on_failure=fail\): "
                                            rf"row 0: .*{fragment.split(':')[0]}"):
        settle(scored, 2, _cfg())
    assert settle(scored, 2, _cfg("reward_model.on_failure=drop")).tolist() == []


def test_unavailable_is_retried_with_backoff(faulty):
    with faulty("flaky") as endpoint:  # UNAVAILABLE twice, then scores
        scored, took = _score(endpoint, _cfg())
        assert scored.failures == {} and scored.scores.tolist() == [1.0] * 6
        assert took >= 0.1 + 0.2  # two backoffs: 0.1 s, then 0.2 s
    with faulty("flaky") as endpoint:  # with one retry allowed, the second UNAVAILABLE is final
        scored, _ = _score(endpoint, _cfg("reward_model.max_retries=1"))
        _all_failed(scored, "UNAVAILABLE after 2 attempts: RewardService.Score: warming up")


def test_failed_rows_fail_the_step_or_leave_with_their_group(faulty):
    with faulty("rows") as endpoint:
        scored, _ = _score(endpoint, _cfg())
    assert scored.failures == {1: "sandbox timed out", 4: "sandbox timed out"}
    values = scored.scores.tolist()
    assert [values[i] for i in (0, 2, 3, 5)] == [1.0] * 4 and math.isnan(values[1]) and math.isnan(values[4])
    with pytest.raises(RewardFailure, match=r"2 of 6 rows .*row 1: sandbox timed out; row 4: sandbox timed out"):
        settle(scored, 2, _cfg())
    keep = settle(scored, 2, _cfg("reward_model.on_failure=drop"))
    assert keep.tolist() == [2, 3]  # groups {0,1} and {4,5} had a failed row
    assert not any(math.isnan(v) for v in scored.scores[keep].tolist())
