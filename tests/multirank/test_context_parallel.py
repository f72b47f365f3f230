"""Context parallelism (gloo processes) against CP=1, through the actor's front door and rank group:
CP=2 (actor and critic side by side), CP=2 x TP=2 with sequence parallelism, and CP=2 x PP=2 give
CP=1's log-probs, values, metrics and weights after one update, and a checkpoint saved at CP=2
loads at CP=1 with the same weights and log-probs.

The batch's rows share prompts in pairs, so every run also exercises the shared-prompt attention
across CP ranks; CP=2 x PP=2 splits its micro-batches by a token budget (actor.use_dynamic_bsz).
Every layout starts from CP=1's initial weights."""
import pytest
import torch
from actor_runs import hf_weights, run_actor

# a token budget as in test_actor_parallel.py: micro-batches of other shapes than CP=1's three rows
BUDGET = ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=15",
          "data.max_prompt_length=6", "data.max_response_length=5"]
LAYOUTS = {"cp1": dict(world=1, tp=1), "cp2": dict(world=2, tp=1, cp=2),
           "cp2tp2": dict(world=4, tp=2, cp=2, sp=True), "cp2pp2": dict(world=4, tp=1, pp=2, cp=2)}
WITH_CRITIC = {"cp1", "cp2"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, arithmetic_tokenizer_dir, run_ranks):
    tmp = tmp_path_factory.mktemp("context_parallel")
    out = {}
    for name, layout in LAYOUTS.items():  # cp1 first: the others start from its weights
        out[name] = run_actor(run_ranks, tmp, name, arithmetic_tokenizer_dir, grouped=True,
                              init_from=None if name == "cp1" else tmp / "cp1" / "init",
                              critic=name in WITH_CRITIC, settings=BUDGET if name == "cp2pp2" else (), **layout)
    return tmp, out


@pytest.mark.parametrize("name", ["cp2", "cp2tp2", "cp2pp2"])
def test_same_update_as_cp1(runs, name):
    _, results = runs
    (ref, ref_dir), (got, got_dir) = results["cp1"], results[name]
    assert torch.equal(got["update_old"], got["before"])  # the update's own forward = the pass, bit for bit
    torch.testing.assert_close(got["before"], ref["before"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["log_probs"], ref["log_probs"], atol=1e-5, rtol=0)
    for k, v in ref["metrics"].items():
        assert got["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert (ref["log_probs"] - ref["before"]).abs().max() > 1e-1  # the update moved the policy
    if "weights" in got:  # PP runs export no HF weights; their log-probs after the update stand for them
        want = hf_weights(ref_dir)
        for k, v in hf_weights(got_dir).items():
            torch.testing.assert_close(v, want[k], atol=5e-5 if name == "cp2pp2" else 1e-5, rtol=0, msg=k)


def test_critic_values_and_update_as_cp1(runs):
    _, results = runs
    ref, got = results["cp1"][0], results["cp2"][0]
    torch.testing.assert_close(got["values"], ref["values"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["values_after"], ref["values_after"], atol=1e-5, rtol=0)
    assert (ref["values_after"] - ref["values"]).abs().max() > 1e-2
    for k, v in ref["critic_metrics"].items():
        if "memory" not in k:
            assert got["critic_metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k


def test_checkpoint_saved_at_cp2_loads_at_cp1(runs, arithmetic_tokenizer_dir, run_ranks):
    tmp, results = runs
    saved = results["cp2"][0]
    got, _ = run_actor(run_ranks, tmp, "load_cp2_at_cp1", arithmetic_tokenizer_dir, 1, 1, grouped=True,
                       critic=True, load_from=results["cp2"][1] / "ckpt")
    for k, v in saved["weights"].items():  # the same weights, bit for bit
        assert torch.equal(got["weights"][k], v), k
    torch.testing.assert_close(got["log_probs"], saved["log_probs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["values_after"], saved["values_after"], atol=1e-5, rtol=0)
