"""megatron's distributed optimizer (actor.megatron.use_distributed_optimizer) on CPU over gloo:
at DP=2 (optimizer state sharded over the two ranks) the same update as the plain optimizer at
DP=1, and its checkpoints (megatron's fully_reshardable format) reshard: saved at DP=2, resumed at
DP=1 or DP=2 with its optimizer state, the next update is the plain optimizer's resumed update. The plain and the
distributed optimizer's checkpoints do not load into each other (a clear error:
tests/unit/test_actor_offload.py)."""
import pytest
import torch
from actor_runs import assert_same_weights, hf_weights, run_actor

DIST = ["actor_rollout_ref.actor.megatron.use_distributed_optimizer=true"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, arithmetic_tokenizer_dir, run_ranks):
    tmp = tmp_path_factory.mktemp("distopt")
    plain = run_actor(run_ranks, tmp, "plain", arithmetic_tokenizer_dir, 1, 1)
    init = tmp / "plain" / "init"
    dist2 = run_actor(run_ranks, tmp, "dist_dp2", arithmetic_tokenizer_dir, 2, 1, init_from=init, settings=DIST)
    return tmp, {"plain": plain, "dist_dp2": dist2}


def test_dp2_distributed_optimizer_updates_as_the_plain_one(runs):
    _, results = runs
    (ref, ref_dir), (got, got_dir) = results["plain"], results["dist_dp2"]
    assert_same_weights(hf_weights(got_dir), hf_weights(ref_dir))
    torch.testing.assert_close(got["log_probs"], ref["log_probs"], atol=1e-5, rtol=0)
    for k, v in ref["metrics"].items():
        assert got["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert (ref["log_probs"] - ref["before"]).abs().max() > 1e-1  # the update moved the policy


def test_a_dp2_checkpoint_resumes_at_dp1_and_dp2_as_the_plain_optimizer_resumes(runs, arithmetic_tokenizer_dir,
                                                                                 run_ranks):
    """Resumed (weights and optimizer state) from the DP=2 checkpoint, at DP=1 and at DP=2, the next
    update is the plain optimizer's resumed from its own checkpoint of the same first update."""
    tmp, results = runs
    ckpt = results["dist_dp2"][1] / "ckpt"
    plain, plain_dir = run_actor(run_ranks, tmp, "plain_resumed", arithmetic_tokenizer_dir, 1, 1,
                                 init_from=results["plain"][1] / "ckpt")
    for world in (1, 2):
        got, got_dir = run_actor(run_ranks, tmp, f"resumed_dp{world}", arithmetic_tokenizer_dir, world, 1,
                                 init_from=ckpt, settings=DIST)
        torch.testing.assert_close(got["before"], results["dist_dp2"][0]["log_probs"], atol=1e-5, rtol=0)
        assert_same_weights(hf_weights(got_dir), hf_weights(plain_dir))
        for k, v in plain["metrics"].items():
            assert got["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), (world, k)
