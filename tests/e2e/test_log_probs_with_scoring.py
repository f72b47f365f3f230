"""trainer.log_probs_with_scoring: `tandem run` with phase 2 started while the rows are scored
gives the same step metrics (losses, KL, rewards, log-prob diffs: everything but timings and memory)
as with it off, on the same seeds; with old and reference log-probs (two mini-batches, KL loss),
and when scoring drops rows (their log-probs leave with them); and old and reference log-probs in one
actor call (trainer.log_probs_one_call) against two; the first mini-batch's old log-probs from the
update (trainer.old_log_probs_from_update) against a pass over every row; the pass the colocated actor
queues behind the generation (trainer.log_probs_after_generation) against rows sent back to it."""
import json
import os

import pytest
from server_process import ROOT
from test_tandem_run import TINY, run_tandem

FLAKY = [f"custom_reward_function.path={ROOT / 'tests' / 'helpers' / 'verl_reward_fn.py'}",
         "custom_reward_function.name=flaky_score", "custom_reward_function.timeout_s=1",
         "reward_model.on_failure=drop"]

EXTRA = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.mode=colocated",
         "actor_rollout_ref.actor.use_kl_loss=true", "trainer.sft.total_steps=0", "trainer.save_freq=0",
         "trainer.max_restarts=0", "trainer.logger=[console,jsonl]",
         "trainer.log_probs_after_generation=false"]  # on: its own test below
VARYING = ("timing_s/", "perf/", "memory/", "actor/memory", "actor/peak", "_gib")


def step_metrics(tmp_path, name: str, on: bool, *extra: str, logs: dict | None = None) -> list[dict]:
    """The run's step metrics but timings and memory (`logs`: filled with each service's log text)."""
    rc, out, err, _ = run_tandem([*TINY, *EXTRA, *extra, f"trainer.log_probs_with_scoring={str(on).lower()}",
                                  f"trainer.default_local_dir={tmp_path / name}", f"trainer.experiment_name={name}"])
    assert rc == 0, f"exit {rc}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    (run_name,) = os.listdir(tmp_path / name)
    log_dir = tmp_path / name / run_name / "logs"
    if logs is not None:
        logs.update({f.removesuffix(".log"): (log_dir / f).read_text() for f in os.listdir(log_dir)})
    lines = [json.loads(x) for x in (tmp_path / name / run_name / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if not any(s in k for s in VARYING)} for m in lines if "actor/pg_loss" in m]


def differences(a: dict, b: dict) -> dict:
    return {k: (v, b.get(k)) for k, v in a.items() if v != b.get(k)}


def test_same_metrics_with_log_probs_started_at_scoring(tmp_path):
    off, on = step_metrics(tmp_path, "off", False), step_metrics(tmp_path, "on", True)
    assert len(on) == len(off) == 2
    assert on[0]["actor/ppo_kl"] == 0.0 and "actor/kl_loss" in on[0] and "training/rollout_probs_diff_max" in on[0]
    for a, b in zip(off, on):
        assert a.keys() == b.keys() and differences(a, b) == {}


def test_rows_dropped_by_scoring_leave_the_early_log_probs(tmp_path):
    off, on = step_metrics(tmp_path, "off", False, *FLAKY), step_metrics(tmp_path, "on", True, *FLAKY)
    assert len(on) == len(off) > 0 and any(m["reward/failed_rows"] > 0 for m in on)
    for a, b in zip(off, on):
        assert a.keys() == b.keys() and differences(a, b) == {}


def test_same_metrics_with_old_and_reference_log_probs_in_one_call(tmp_path):
    """trainer.log_probs_one_call (the default): one ComputeLogProb request with_reference instead of
    ComputeLogProb and ComputeRefLogProb, the same numbers."""
    two = step_metrics(tmp_path, "two", False, "trainer.log_probs_one_call=false")
    one = step_metrics(tmp_path, "one", False, "trainer.log_probs_one_call=true")
    assert len(one) == len(two) == 2 and "actor/kl_loss" in one[0]  # the reference ran
    for a, b in zip(two, one):
        assert a.keys() == b.keys() and differences(a, b) == {}


def test_same_metrics_with_the_first_mini_batch_old_log_probs_from_the_update(tmp_path):
    """trainer.old_log_probs_from_update (the default): two mini-batches here, the first one's old
    log-probs from the update's own forward (the log-prob pass takes the second only); the same
    numbers as a pass over every row, rollout_probs_diff included (the update returns them)."""
    off = step_metrics(tmp_path, "pass", False, "trainer.old_log_probs_from_update=false")
    on = step_metrics(tmp_path, "update", True, "trainer.old_log_probs_from_update=true")
    assert len(on) == len(off) == 2 and "training/rollout_probs_diff_max" in on[0]
    for a, b in zip(off, on):
        assert a.keys() == b.keys() and differences(a, b) == {}


@pytest.mark.parametrize("minis", [2, 1])
def test_same_metrics_with_the_log_prob_pass_queued_behind_the_generation(tmp_path, minis):
    """trainer.log_probs_after_generation (the default, colocated): the actor runs the step's old and
    reference pass (one mini-batch: the reference's alone, the update gives the old log-probs) right
    after its rollout generated the rows and keeps them; the controller asks for that pass's result
    instead of sending the rows back, and sends the update with the advantages and the kept rows'
    numbers only, right after scoring. Same numbers as sending them, with rows dropped by scoring
    too; the actor's log shows the queued pass and the kept rows served every step."""
    keys = [*FLAKY, f"actor_rollout_ref.actor.ppo_mini_batch_size={4 // minis}"]
    off = step_metrics(tmp_path, "sent", False, *keys)
    logs = {}
    on = step_metrics(tmp_path, "kept", False, *keys, "trainer.log_probs_after_generation=true", logs=logs)
    assert len(on) == len(off) == 2 and any(m["reward/failed_rows"] > 0 for m in on) and "actor/kl_loss" in on[0]
    for a, b in zip(off, on):
        assert a.keys() == b.keys() and differences(a, b) == {}
    assert logs["actor"].count("log_probs.kept_rows") == 2 and logs["actor"].count("\"queued_pass\": \"used\"") == 2
    assert logs["actor"].count("update.kept_rows") == 2  # the updates took the kept rows too (GRPO: no values)
