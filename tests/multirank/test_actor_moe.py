"""The actor on a tiny Qwen3-MoE (built locally with transformers) at expert parallel 2 (2 gloo
ranks: DP=2 for dense weights, 2 of the 4 experts each) and at TP=2 with sequence parallelism,
against one rank, with the router load-balancing loss on: same log-probs, same weights after
one PPO update (two mini-batches), same metrics (the load-balancing loss included), the same
TP=1-layout weights for a standalone rollout, and a checkpoint saved at EP=2 that loads at
EP=1. Micro-batches are single rows, so every layout routes the same rows together and the
load-balancing statistics agree exactly (tandem/train/moe_aux_loss.py)."""
import pytest
import torch
from actor_runs import assert_same_weights, hf_weights, run_actor
from tiny_hf import tiny_qwen3_moe

LAYOUTS = {"ep1": dict(world=1, tp=1), "ep2": dict(world=2, tp=1, ep=2), "tp2sp": dict(world=2, tp=2, sp=True)}
LB = "actor/moe_load_balancing_loss"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, arithmetic_tokenizer_dir, run_ranks):
    tmp = tmp_path_factory.mktemp("moe_actor")
    hf = tiny_qwen3_moe(tmp / "hf", head_dim=32, norm_topk_prob=True)
    settings = [f"actor_rollout_ref.model.path={hf}", "actor_rollout_ref.rollout.mode=standalone",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                "actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.05"]
    results = {name: run_actor(run_ranks, tmp, name, arithmetic_tokenizer_dir, settings=settings, **kw)
               for name, kw in LAYOUTS.items()}
    return tmp, settings, results


@pytest.mark.parametrize("name", ["ep2", "tp2sp"])
def test_same_update_as_one_rank(runs, name):
    _, _, results = runs
    (ref, ref_dir), (got, got_dir) = results["ep1"], results[name]
    torch.testing.assert_close(got["before"], ref["before"], atol=1e-5, rtol=0)
    assert_same_weights(hf_weights(got_dir), hf_weights(ref_dir))
    assert_same_weights(got["weights"], ref["weights"])  # the standalone rollout's TP=1, EP=1 layout
    torch.testing.assert_close(got["log_probs"], ref["log_probs"], atol=1e-5, rtol=0)
    assert ref["metrics"].keys() == got["metrics"].keys()
    for k, v in ref["metrics"].items():
        assert got["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert 1.0 <= ref["metrics"][LB] < 2.0  # 1.0 = perfectly balanced
    assert (ref["log_probs"] - ref["before"]).abs().max() > 1e-2  # the update moved the policy
    experts = [k for k in ref["weights"] if ".local_experts." in k]
    assert len(experts) == 2 * 4 * 2  # layers x experts x (fc1, fc2), under their global index


def test_checkpoint_saved_at_ep2_loads_at_ep1(runs, arithmetic_tokenizer_dir, run_ranks):
    tmp, settings, results = runs
    got, _ = run_actor(run_ranks, tmp, "load_ep2_at_ep1", arithmetic_tokenizer_dir, 1, 1, settings=settings,
                       load_from=results["ep2"][1] / "ckpt")
    torch.testing.assert_close(got["log_probs"], results["ep2"][0]["log_probs"], atol=1e-5, rtol=0)
    assert_same_weights(got["weights"], results["ep2"][0]["weights"], atol=0)
