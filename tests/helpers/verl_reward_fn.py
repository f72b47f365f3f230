"""Custom reward functions in verl's shape (custom_reward_function.path / .name), as a verl user
writes them: plain functions of (data_source, solution_str, ground_truth, extra_info), returning a
float or a dict with a "score". Loaded by the reward service from this file's path."""
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's example shape: exact match, with the dict form verl's own scorers return."""
    correct = solution_str.strip() == ground_truth.strip()
    return {"score": 1.0 if correct else 0.0, "acc": correct, "pred": solution_str.strip()}


def length_bonus(data_source, solution_str, ground_truth, extra_info=None, scale=0.1):
    """A float, with a reward_kwargs argument (custom_reward_function.reward_kwargs.scale)."""
    return float(solution_str.strip() == ground_truth.strip()) + scale * len(solution_str) / 10


def flaky_score(data_source, solution_str, ground_truth, extra_info=None):
    """Raises for ground truths divisible by 4, hangs past any timeout for those = 1 mod 8 (each
    costs a test its timeout), scores 1.0 otherwise (so a silent 0 from a failed row would show in
    the mean)."""
    value = int(ground_truth)
    if value % 4 == 0:
        raise ZeroDivisionError(f"cannot score {value}")
    if value % 8 == 1:
        time.sleep(60)
    return 1.0
