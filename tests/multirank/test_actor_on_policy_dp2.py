"""On-policy updates (UpdateActor(on_policy): the update's own forward gives the old log-probs)
at TP=2 and PP=2 (gloo processes), through the service's front door and rank group: the
returned old log-probs are ComputeLogProb's, and the update is the same, bit for bit, as
ComputeLogProb followed by a normal update at the same layout and from the same weights.
(One rank and DP=2 are tests/unit/test_actor_on_policy.py and tests/services/test_bad_inputs.py.)"""
import pytest
import torch
from actor_runs import run_actor

LAYOUTS = {"tp2": (2, 2, 1), "pp2": (2, 1, 2)}  # name: (world size, TP, PP)
ONE_MINI = ["actor_rollout_ref.actor.ppo_mini_batch_size=4"]  # the whole batch, as on-policy needs


@pytest.fixture(scope="module")
def init(tmp_path_factory, arithmetic_tokenizer_dir, run_ranks):
    tmp = tmp_path_factory.mktemp("on_policy")
    run_actor(run_ranks, tmp, "tp1", arithmetic_tokenizer_dir, 1, 1, settings=ONE_MINI)  # writes tp1/init
    return tmp


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_on_policy_update_equals_log_prob_pass_then_update(init, arithmetic_tokenizer_dir, run_ranks, name):
    world, tp, pp = LAYOUTS[name]
    common = dict(world=world, tp=tp, pp=pp, init_from=init / "tp1" / "init", settings=ONE_MINI)
    ref, _ = run_actor(run_ranks, init, f"{name}_off", arithmetic_tokenizer_dir, **common)
    got, _ = run_actor(run_ranks, init, f"{name}_on", arithmetic_tokenizer_dir, on_policy=True, **common)
    assert torch.equal(got["on_policy_old"], ref["before"])
    assert got["metrics"] == ref["metrics"] and got["metrics"]["actor/ppo_kl"] == 0.0
    assert torch.equal(got["log_probs"], ref["log_probs"])  # the new weights, through the model
    assert (ref["log_probs"] - ref["before"]).abs().max() > 1e-2  # the update moved the policy
