"""Micro-batches by a token budget (actor.use_dynamic_bsz) over gloo ranks, the service's own front door
and rank group: at DP=2 each rank splits its own shard (so the ranks may run different numbers of
micro-batches), at PP=2 every stage splits the same rows; both against rows of three per micro-batch
at one rank: same log-probs before and after one PPO update (two mini-batches), same metrics and weights."""
import pytest
import torch
from actor_runs import assert_same_weights, hf_weights, run_actor

# the batch's rows hold 11, 5, 8, 7, 7, 8, 11, 5 tokens (tests/helpers/actor_rank.py fixed_batch): at DP=2 the first
# mini-batch's shards [11, 5] and [8, 7] run as 2 and 1 micro-batches of at most 15 tokens
BUDGET = ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=15",
          "data.max_prompt_length=6", "data.max_response_length=5"]
LAYOUTS = {"dp2": (2, 1, 1), "pp2": (2, 1, 2)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, arithmetic_tokenizer_dir, run_ranks):
    tmp = tmp_path_factory.mktemp("token_budget")
    return tmp, run_actor(run_ranks, tmp, "rows", arithmetic_tokenizer_dir, 1, 1)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_same_update_as_rows_at_one_rank(runs, arithmetic_tokenizer_dir, run_ranks, name):
    tmp, (ref, ref_dir) = runs
    world, tp, pp = LAYOUTS[name]
    got, got_dir = run_actor(run_ranks, tmp, name, arithmetic_tokenizer_dir, world, tp, pp,
                             init_from=ref_dir / "init", settings=BUDGET)
    torch.testing.assert_close(got["before"], ref["before"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["log_probs"], ref["log_probs"], atol=1e-5, rtol=0)
    if pp > 1:  # HF export gathers TP only: compare the PP run's weights reloaded at one rank
        _, got_dir = run_actor(run_ranks, tmp, f"load_{name}_at_tp1", arithmetic_tokenizer_dir, 1, 1,
                               load_from=got_dir / "ckpt")
    assert_same_weights(hf_weights(got_dir), hf_weights(ref_dir), atol=5e-5)  # as test_actor_shared_prompts.py
    for k, v in ref["metrics"].items():
        assert got["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert (ref["log_probs"] - ref["before"]).abs().max() > 1e-1  # the update moved the policy
