"""Exact resume: a run stopped after step 1 and resumed with `trainer.resume_mode=auto` logs the same
metrics for steps 2..8 as an uninterrupted run, one line per step, and keeps the warm start's facts in
summary.json (tests/e2e/conftest.py: PPO with a critic, a standalone
rollout, the adaptive KL controller and a two-rank actor, so every piece of state is exercised)."""
import json

from conftest import PPO_STATEFUL, STEPS
from kill_runs import metric_lines, step_metrics
from test_tandem_run import TINY, run_tandem


def tandem(tmp_path, *extra):
    rc, out, err, _ = run_tandem([*PPO_STATEFUL, f"trainer.default_local_dir={tmp_path}",
                                  "trainer.experiment_name=parts", *extra], timeout_s=400)
    assert rc == 0, f"exit {rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}"
    return out


def test_stopped_and_resumed_run_equals_uninterrupted(ppo_reference, tmp_path):
    tandem(tmp_path, "trainer.total_training_steps=1")  # stops after step 1 (checkpoint)
    (parts,) = tmp_path.iterdir()
    first = json.loads((parts / "summary.json").read_text())
    out = tandem(tmp_path, "trainer.resume_mode=auto")
    assert f"resuming {parts}" in out and "global_step_1" in out
    got = step_metrics(parts)  # (one line per step: the first run's final validation is in step 1's)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert [m["step"] for m in metric_lines(parts)] == list(range(STEPS + 1))
    for step in range(2, STEPS + 1):
        assert got[step] == ppo_reference[step], f"step {step} differs"
    summary = json.loads((parts / "summary.json").read_text())
    assert summary["resumed_from"].endswith("global_step_1")
    assert summary["val_accuracy_after_sft"] is not None
    sft_facts = ("val_accuracy_init", "sft_steps", "sft_dev_accuracy")  # the warm start's, not redone
    assert first["sft_steps"] == 3 and [s for s, _ in first["sft_dev_accuracy"]] == [2, 3]
    assert {k: summary[k] for k in sft_facts} == {k: first[k] for k in sft_facts}
    assert (parts / "checkpoints" / f"global_step_{STEPS}" / "controller_state.json").is_file()


def test_resume_path_must_be_a_checkpoint(tmp_path):
    rc, out, err, _ = run_tandem([*TINY, "trainer.resume_mode=resume_path",
                                  f"trainer.resume_from_path={tmp_path}"], timeout_s=60)
    assert rc != 0 and "trainer.resume_from_path" in err + out
