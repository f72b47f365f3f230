"""`tandem run` on a tiny Qwen3-MoE (built locally with transformers, the built-in tokenizer
saved beside it) with the actor at expert parallel 2 (two gloo processes, half the experts
each) and a standalone rollout at EP=1 that receives every expert after each update, with the
router load-balancing loss on."""
from test_sharded_services import finished
from tiny_hf import tiny_qwen3_moe


def test_grpo_actor_ep2_standalone_rollout(tmp_path):
    from transformers import AutoTokenizer

    from tandem.tasks.arithmetic import build_tokenizer

    model = tiny_qwen3_moe(tmp_path / "model", head_dim=32, norm_topk_prob=True)
    AutoTokenizer.from_pretrained(build_tokenizer(str(tmp_path / "tok"))).save_pretrained(model)
    pids, steps, _ = finished(tmp_path, "moe_ep2", [
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.mode=standalone",
        "services.actor.world_size=2", "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.01"])
    assert len(pids["actor"]) == 2 and len(pids["rollout"]) == 1
    assert sorted(steps) == [1, 2]
    assert all(1.0 <= m["actor/moe_load_balancing_loss"] < 4.0 for m in steps.values())
    # step 2 generated with the weights synced after step 1's update, every expert gathered from
    # both EP ranks: the rollout's token probabilities match the actor's recomputation
    assert steps[2]["training/rollout_probs_diff_max"] < 1e-4
