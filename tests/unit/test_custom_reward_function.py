"""verl's custom reward function in the reward service's process pool: verl's two return shapes
and reward_kwargs; a function that raises, hangs past its timeout or returns something else
leaves that row failed with the reason (never a score), and the pool keeps working after a
killed call; a missing file or function is an error naming the key."""
import math
import pathlib

import pytest

from tandem.services.reward.custom_function import CustomRewardFunction

FN = str(pathlib.Path(__file__).resolve().parents[1] / "helpers" / "verl_reward_fn.py")


def test_verl_shapes_failures_and_timeouts(tmp_path):
    exact = CustomRewardFunction(FN)  # compute_score: verl's dict shape
    try:
        out = exact.score(["12", " 7 ", "x"], ["12", "7", "3"], ["a", "b", "c"], [{}, {"k": 1}, {}])
        assert out.scores == [1.0, 1.0, 0.0] and out.failures == {}
    finally:
        exact.close()
    bonus = CustomRewardFunction(FN, "length_bonus", {"scale": 1.0})  # a float, with reward_kwargs
    try:
        assert bonus.score(["12345"], ["12345"]).scores == [1.5]
    finally:
        bonus.close()
    flaky = CustomRewardFunction(FN, "flaky_score", timeout_s=1.0, num_workers=2)
    try:
        out = flaky.score(["a", "b", "c", "d"], ["8", "9", "5", "7"])  # 8: raises; 9: hangs; 5, 7: 1.0
        assert out.failures == {0: "flaky_score raised ZeroDivisionError: cannot score 8",
                                1: "flaky_score exceeded custom_reward_function.timeout_s=1 (killed)"}
        assert math.isnan(out.scores[0]) and math.isnan(out.scores[1]) and out.scores[2:] == [1.0, 1.0]
        assert flaky.score(["a"], ["3"]).scores == [1.0]  # the killed worker was replaced
    finally:
        flaky.close()
    bad = tmp_path / "bad.py"
    bad.write_text("def compute_score(**kw):\n    return 'yes'\n\ndef nan(**kw):\n    return float('nan')\n")
    for name, reason in (("compute_score", "compute_score returned str, not a number or a dict with 'score'"),
                         ("nan", "nan returned a non-finite score nan")):
        fn = CustomRewardFunction(str(bad), name)
        try:
            assert fn.score(["a"], ["a"]).failures == {0: reason}
        finally:
            fn.close()
    with pytest.raises(ValueError, match="custom_reward_function.name: .* defines no function 'missing'"):
        CustomRewardFunction(FN, "missing")
    with pytest.raises(ValueError, match="custom_reward_function.path: '/no/file.py' is not a file"):
        CustomRewardFunction("/no/file.py")
