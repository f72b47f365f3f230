"""megatron's distributed optimizer (actor.megatron.use_distributed_optimizer) on CPU over gloo:
at DP=2 (optimizer state sharded over the two ranks) and DP=1 the same update as the plain
optimizer at DP=1, and its checkpoints (megatron's fully_reshardable format) load into the plain
optimizer and the reverse, carrying the optimizer state (the next update is the same)."""
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


@pytest.mark.parametrize("saved, world, settings", [("dist_dp2", 1, ()), ("plain", 2, DIST)])
def test_checkpoints_cross_between_distributed_and_plain(runs, arithmetic_tokenizer_dir, run_ranks,
                                                         saved, world, settings):
    """Resume from the other optimizer's checkpoint, then one more update: the same as the
    saver's own layout resumed from its own checkpoint (weights and optimizer state carried)."""
    tmp, results = runs
    ckpt = results[saved][1] / "ckpt"
    own_world, own_settings = (2, DIST) if saved == "dist_dp2" else (1, ())
    got, got_dir = run_actor(run_ranks, tmp, f"{saved}_resumed_at_{world}", arithmetic_tokenizer_dir, world, 1,
                             init_from=ckpt, settings=settings)
    want, want_dir = run_actor(run_ranks, tmp, f"{saved}_resumed_own", arithmetic_tokenizer_dir, own_world, 1,
                               init_from=ckpt, settings=own_settings)
    torch.testing.assert_close(got["before"], results[saved][0]["log_probs"], atol=1e-5, rtol=0)
    assert_same_weights(hf_weights(got_dir), hf_weights(want_dir))
    assert got["metrics"]["actor/grad_norm"] == pytest.approx(want["metrics"]["actor/grad_norm"], rel=1e-4)
