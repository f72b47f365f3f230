"""The actor's prompt sharing (each prompt run once for its rows) at TP=1, TP=2, TP=2 with sequence parallelism and PP=2
(gloo processes, the service's own front door and rank group) against the rows run with their
own prompts at TP=1: same log-probs before and after one PPO update (two mini-batches, three
rows per micro-batch, so groups are split across micro-batches too), same metrics and weights.
The batch's rows share prompts in pairs (tests/helpers/actor_rank.py --grouped)."""
import pytest
import torch
from actor_runs import assert_same_weights, hf_weights, run_actor

LAYOUTS = {"tp1": (1, 1, 1, False), "tp2": (2, 2, 1, False), "tp2sp": (2, 2, 1, True), "pp2": (2, 1, 2, False)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, arithmetic_tokenizer_dir, run_ranks):
    tmp = tmp_path_factory.mktemp("shared_prompts")
    ref = run_actor(run_ranks, tmp, "own_prompts", arithmetic_tokenizer_dir, 1, 1, grouped=True, own_prompts=True)
    return tmp, ref


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_same_update_as_own_prompts(runs, arithmetic_tokenizer_dir, run_ranks, name):
    tmp, (ref, ref_dir) = runs
    world, tp, pp, sp = LAYOUTS[name]
    got, got_dir = run_actor(run_ranks, tmp, name, arithmetic_tokenizer_dir, world, tp, pp, sp=sp,
                             init_from=ref_dir / "init", grouped=True)
    torch.testing.assert_close(got["before"], ref["before"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["log_probs"], ref["log_probs"], atol=1e-5, rtol=0)
    if pp > 1:  # HF export gathers TP only: compare the PP run's weights reloaded at TP=1
        _, got_dir = run_actor(run_ranks, tmp, f"load_{name}_at_tp1", arithmetic_tokenizer_dir, 1, 1,
                               load_from=got_dir / "ckpt", grouped=True)
    # Adam scales each element's step to about lr (1e-4) whatever its gradient's size, so a near-zero
    # gradient summed in another order can move its weight measurably (seen: 1 of 4,096 elements
    # 1.1e-5 off at TP=1); a wrong gradient would move many by ~lr, and the log-probs above agree
    assert_same_weights(hf_weights(got_dir), hf_weights(ref_dir), atol=5e-5)
    for k, v in ref["metrics"].items():
        assert got["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert (ref["log_probs"] - ref["before"]).abs().max() > 1e-1  # the update moved the policy
