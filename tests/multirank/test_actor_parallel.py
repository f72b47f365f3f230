"""The actor at TP=2, DP=2, PP=2 and TP=2 x PP=2 (gloo processes) against TP=1, through the
service's own front door and rank group: same log-probs, same weights after one PPO update
(two mini-batches), and checkpoints that reshard between TP=2 / PP=2 and TP=1. Every layout
starts from TP=1's initial weights (a random init differs across stages).

The batch's rows share prompts in pairs (n=2 samples), so every run computes each prompt once for
its rows; TP=1 is also run with each row on its own copy of its prompt: the same log-probs before and
after the update, metrics and weights (up to float rounding). The DP=2 and PP=2 runs split their
micro-batches by a token budget (actor.use_dynamic_bsz) instead of three rows: at DP=2 each rank splits
its own shard, so the ranks run different numbers of micro-batches. At every layout the update's own
forward gives the first mini-batch's old log-probs bit for bit as the pass does."""
import pytest
import torch
from actor_runs import assert_same_weights, hf_weights, run_actor

# the grouped batch's rows hold 11, 8, 8, 5, 7, 5, 11, 10 tokens (tests/helpers/actor_rank.py fixed_batch):
# at DP=2 the first mini-batch's shards [11, 8] and [8, 5] run as 2 and 1 micro-batches of at most 15 tokens
BUDGET = ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=15",
          "data.max_prompt_length=6", "data.max_response_length=5"]
LAYOUTS = {"tp1": (1, 1, 1), "tp2": (2, 2, 1), "dp2": (2, 1, 1), "tp2sp": (2, 2, 1),
           "pp2": (2, 1, 2), "tp2pp2": (4, 2, 2)}  # name: (world size, TP, PP)
ON_BUDGET = {"dp2", "pp2"}


def run_layout(run_ranks, tmp, name, tokenizer_dir, world, tp, pp, load_from=None, own_prompts=False):
    init_from = tmp / "tp1" / "init" if name != "tp1" and not load_from else None
    return run_actor(run_ranks, tmp, name, tokenizer_dir, world, tp, pp, sp=name.endswith("sp"),
                     init_from=init_from, load_from=load_from, grouped=True, own_prompts=own_prompts,
                     settings=BUDGET if name in ON_BUDGET else ())


@pytest.fixture(scope="module")
def runs(tmp_path_factory, arithmetic_tokenizer_dir, run_ranks):
    tmp = tmp_path_factory.mktemp("parallel")
    out = {name: run_layout(run_ranks, tmp, name, arithmetic_tokenizer_dir, *layout)
           for name, layout in LAYOUTS.items()}  # tp1 first: the others start from its weights
    out["own_prompts"] = run_layout(run_ranks, tmp, "own_prompts", arithmetic_tokenizer_dir, 1, 1, 1, own_prompts=True)
    return tmp, out


def assert_same_update(got, got_dir, ref, ref_dir, weights_atol: float) -> None:
    torch.testing.assert_close(got["before"], ref["before"], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["log_probs"], ref["log_probs"], atol=1e-5, rtol=0)
    assert_same_weights(hf_weights(got_dir), hf_weights(ref_dir), atol=weights_atol)
    for k, v in ref["metrics"].items():
        assert got["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    # the update really moved the policy (Adam at lr 1e-4 keeps first-step noise on
    # near-zero gradients below the 1e-5 tolerance; a wrong gradient would not be)
    assert (ref["log_probs"] - ref["before"]).abs().max() > 1e-1
    assert ref["metrics"]["actor/ppo_kl"] != 0.0  # averaged over 2 mini-batches: the 2nd is off-policy


@pytest.mark.parametrize("name", ["tp2", "dp2", "tp2sp", "pp2", "tp2pp2"])
def test_same_update_as_tp1(runs, arithmetic_tokenizer_dir, run_ranks, name):
    tmp, results = runs
    (ref, ref_dir), (got, got_dir) = results["tp1"], results[name]
    assert got["update_rows"] == ref["update_rows"] == 4  # the first mini-batch: 2 prompts x n=2
    assert torch.equal(got["update_old"], got["before"])  # its own forward = the pass, bit for bit
    if LAYOUTS[name][2] > 1:  # HF export gathers TP only: compare the PP run's weights reloaded at TP=1
        _, got_dir = run_layout(run_ranks, tmp, f"load_{name}_at_tp1", arithmetic_tokenizer_dir, 1, 1, 1,
                                load_from=got_dir / "ckpt")
    # Adam scales each element's step to about lr (1e-4) whatever its gradient's size, so a near-zero
    # gradient summed in another order (other micro-batches) can move its weight measurably
    assert_same_update(got, got_dir, ref, ref_dir, 5e-5 if name in ON_BUDGET else 1e-5)


def test_prompts_run_once_give_the_update_of_each_row_on_its_own_copy(runs):
    _, results = runs
    (ref, ref_dir), (got, got_dir) = results["own_prompts"], results["tp1"]
    assert_same_update(got, got_dir, ref, ref_dir, 5e-5)  # (seen: 1 of 4,096 elements 1.1e-5 off)


@pytest.mark.parametrize("saved,loaded", [("tp2", "tp1"), ("tp1", "tp2"), ("tp1", "pp2")])
def test_checkpoint_reshards(runs, arithmetic_tokenizer_dir, run_ranks, saved, loaded):
    tmp, results = runs
    got, _ = run_layout(run_ranks, tmp, f"load_{saved}_at_{loaded}", arithmetic_tokenizer_dir, *LAYOUTS[loaded],
                        load_from=results[saved][1] / "ckpt")
    torch.testing.assert_close(got["log_probs"], results[saved][0]["log_probs"], atol=1e-5, rtol=0)
    if "weights" in got:  # the TP=1-layout export (standalone rollout sync) is the same at any TP
        ref = results[saved][0]["weights"]
        assert got["weights"].keys() == ref.keys()
        for k in ref:
            assert torch.equal(got["weights"][k], ref[k]), k
