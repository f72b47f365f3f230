"""Exact resume: a run stopped after step 1 and resumed with `trainer.resume_mode=auto` logs
the same metrics for steps 2..4 as an uninterrupted run (PPO with a critic, a standalone
rollout and the adaptive KL controller, so every piece of state is exercised)."""
import json
import os

from test_tandem_run import TINY, run_tandem

PPO = ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.mode=standalone",
       "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "trainer.logger=[jsonl]"]
TIMING = ("timing_s/", "perf/")  # wall-clock figures differ between any two runs


def step_metrics(run_dir) -> dict[int, dict]:
    lines = [json.loads(x) for x in open(os.path.join(run_dir, "metrics.jsonl"))]
    return {m["step"]: {k: v for k, v in m.items() if not k.startswith(TIMING)}
            for m in lines if "actor/pg_loss" in m}


def tandem(tmp_path, name, *extra):
    rc, out, err, _ = run_tandem([*TINY, *PPO, f"trainer.default_local_dir={tmp_path}",
                                  f"trainer.experiment_name={name}", *extra])
    assert rc == 0, f"exit {rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}"
    return out


def test_stopped_and_resumed_run_equals_uninterrupted(tmp_path):
    tandem(tmp_path, "whole", "trainer.total_training_steps=4")
    tandem(tmp_path, "parts", "trainer.total_training_steps=1")  # stops after step 1 (checkpoint)
    out = tandem(tmp_path, "parts", "trainer.total_training_steps=4", "trainer.resume_mode=auto")
    (whole,) = [p for p in tmp_path.iterdir() if p.name.startswith("whole")]
    (parts,) = [p for p in tmp_path.iterdir() if p.name.startswith("parts")]
    assert f"resuming {parts}" in out and "global_step_1" in out
    ref, got = step_metrics(whole), step_metrics(parts)
    assert sorted(ref) == [1, 2, 3, 4] and sorted(got) == [1, 2, 3, 4]
    for step in (2, 3, 4):
        assert got[step] == ref[step], f"step {step} differs"
    assert ref[2] != ref[3]  # the steps really differ from each other
    summary = json.loads((parts / "summary.json").read_text())
    assert summary["resumed_from"].endswith("global_step_1")
    assert summary["val_accuracy_after_sft"] is not None
    assert (parts / "checkpoints" / "global_step_4" / "controller_state.json").is_file()


def test_resume_path_must_be_a_checkpoint(tmp_path):
    rc, out, err, _ = run_tandem([*TINY, "trainer.resume_mode=resume_path",
                                  f"trainer.resume_from_path={tmp_path}"], timeout_s=60)
    assert rc != 0 and "trainer.resume_from_path" in err + out
