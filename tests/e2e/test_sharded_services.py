"""`tandem run` with services of several ranks (gloo on CPU): the actor at TP=2 with sequence
parallelism serving the colocated rollout, and a PPO run whose actor, critic and standalone rollout each run DP=2.
Every rank is its own OS process; rank 0 of each serves gRPC."""
import json
import os
import subprocess
import sys
import time

import psutil
from test_tandem_run import TINY, run_tandem


def finished(tmp_path, name, extra) -> tuple[dict, dict]:
    rc, out, err, pids = run_tandem([*TINY, f"trainer.default_local_dir={tmp_path}",
                                     f"trainer.experiment_name={name}", "trainer.logger=[jsonl]", *extra],
                                    timeout_s=400)
    assert rc == 0, f"exit {rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}"
    deadline = time.monotonic() + 30  # every rank of every service is gone after the run
    while any(psutil.pid_exists(p) for ps in pids.values() for p in ps) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for ps in pids.values() for p in ps if psutil.pid_exists(p)]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name.startswith(name)]
    lines = [json.loads(x) for x in open(os.path.join(run_dir, "metrics.jsonl"))]
    return pids, {m["step"]: m for m in lines if "actor/pg_loss" in m}, run_dir


def test_actor_tp2_sp_colocated(tmp_path):
    pids, steps, run_dir = finished(tmp_path, "tp2", [
        "services.actor.world_size=2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.sequence_parallel=true",  # generation runs with SP off
        "actor_rollout_ref.actor.entropy_coeff=0.01"])  # a gradient even when every reward is equal
    assert len(pids["actor"]) == 2  # rank 0 (front door) and rank 1
    assert sorted(steps) == [1, 2] and all(m["actor/grad_norm"] > 0 for m in steps.values())
    assert all(m["training/rollout_probs_diff_max"] < 1e-4 for m in steps.values())  # engine == trainer
    # the final checkpoint (saved at TP=2) exports on one rank as a Hugging Face model
    out = tmp_path / "hf"
    done = subprocess.run([sys.executable, "-m", "tandem.services.actor.export",
                           str(run_dir / "checkpoints" / "global_step_2"), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("12+7=", return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape[-1] >= len(tokenizer)
    bad = subprocess.run([sys.executable, "-m", "tandem.services.actor.export", str(tmp_path), str(out)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "checkpoint" in bad.stderr


def test_ppo_actor_tp2_standalone_rollout_dp2(tmp_path):
    """The actor at TP=2 syncs its weights to a standalone rollout of 2 DP ranks at TP=1 after
    every update (gathered to the TP=1 layout, tandem/convert/reshard.py); the critic runs at DP=2."""
    pids, steps, _ = finished(tmp_path, "tp2_standalone", [
        "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.mode=standalone",
        "services.actor.world_size=2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "services.critic.world_size=2", "services.rollout.world_size=2"])
    assert {r: len(p) for r, p in pids.items()} == {"actor": 2, "critic": 2, "rollout": 2, "reward": 1}
    assert sorted(steps) == [1, 2] and all(m["critic/vf_loss"] >= 0 for m in steps.values())
    # step 2 generated with the weights synced after step 1's update: the rollout's token
    # probabilities match the actor's recomputation (a mis-laid-out sync gives ~0.1-1)
    assert steps[2]["training/rollout_probs_diff_max"] < 1e-4


def test_grpo_two_rollout_replicas(tmp_path):
    """services.rollout.replicas=2: two standalone rollout services, each synced by the weight
    plane after every update, each generating its share of every batch."""
    pids, steps, run_dir = finished(tmp_path, "replicas2", [
        "actor_rollout_ref.rollout.mode=standalone", "services.rollout.replicas=2"])
    assert {r: len(p) for r, p in pids.items()} == {"actor": 1, "rollout": 2, "reward": 1}
    assert (run_dir / "logs" / "rollout-1.log").is_file()
    assert sorted(steps) == [1, 2] and all(m["weight_sync/bytes"] > 0 for m in steps.values())
    assert [m["rollout/weights_version"] for m in steps.values()] == [4, 5]  # 3 SFT steps, then updates
    assert steps[2]["training/rollout_probs_diff_max"] < 1e-4


def test_actor_pp2_generates_on_tp1_copies(tmp_path):
    """A run with the actor at PP=2: the colocated rollout generates on a TP=1 copy of the whole
    policy on each rank, gathered from both pipeline stages before every generation."""
    pids, steps, run_dir = finished(tmp_path, "pp2", [
        "services.actor.world_size=2", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.actor.entropy_coeff=0.01"])
    assert len(pids["actor"]) == 2
    assert sorted(steps) == [1, 2] and all(m["actor/grad_norm"] > 0 for m in steps.values())
    # step 2 generated after step 1's update: the copies follow the policy (a stale or mis-laid-out
    # copy gives differences of ~0.1-1)
    assert all(m["training/rollout_probs_diff_max"] < 1e-4 for m in steps.values())
    assert (run_dir / "checkpoints" / "global_step_2" / "controller_state.json").exists()
