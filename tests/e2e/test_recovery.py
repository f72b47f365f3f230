"""Crash recovery end to end: kill -9 one service (or one rank of a two-rank actor) mid-run;
the run restarts it, goes back to its latest checkpoint (the reward service: sends the
failed call again) and completes, and every RL step's metrics (every key but wall-clock
timings) equal those of an uninterrupted run of the same config.

PPO with a critic and a standalone rollout, so each of the four roles is its own service
and every piece of state (policy, reference, optimizers, critic, rollout weights, data
cursor, adaptive KL controller) must come back exactly."""
import json
import os

import pytest
from kill_runs import run_and_kill, step_metrics
from test_tandem_run import TINY, run_tandem

STEPS = 8
RECOVERY = [*TINY, "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.mode=standalone",
            "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "trainer.logger=[jsonl]",
            f"trainer.total_training_steps={STEPS}", "trainer.save_freq=2", "trainer.max_restarts=2"]
TWO_RANK_ACTOR = ["services.actor.world_size=2"]  # two data-parallel ranks


def uninterrupted(tmp_path_factory, name, extra=()) -> dict[int, dict]:
    root = tmp_path_factory.mktemp(name)
    rc, out, err, _ = run_tandem([*RECOVERY, *extra, f"trainer.default_local_dir={root}",
                                  f"trainer.experiment_name={name}"], timeout_s=400)
    assert rc == 0, f"exit {rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}"
    (run_dir,) = root.iterdir()
    return step_metrics(run_dir)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return uninterrupted(tmp_path_factory, "whole")


@pytest.fixture(scope="module")
def reference_two_ranks(tmp_path_factory):
    return uninterrupted(tmp_path_factory, "whole2", TWO_RANK_ACTOR)


def killed_run(tmp_path, role: str, rank: int = 0, extra=()) -> tuple[str, str, dict]:
    rc, out, err, run_dir, pid = run_and_kill([*RECOVERY, *extra, f"trainer.default_local_dir={tmp_path}",
                                               f"trainer.experiment_name=kill_{role}"], role, rank, after_step=3)
    assert rc == 0, f"exit {rc}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    assert f"the {role} service died" in out and "restart 1 of 2" in out, out[-3000:]
    summary = json.loads(open(os.path.join(run_dir, "summary.json")).read())
    assert summary["restarts"] == 1
    lines = [json.loads(x) for x in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [m["trainer/restarts"] for m in lines if "trainer/restarts" in m] == [1]
    return out, run_dir, summary


def assert_same_steps(run_dir, reference) -> None:
    got = step_metrics(run_dir)
    assert sorted(got) == sorted(reference) == list(range(1, STEPS + 1))
    for step in reference:
        assert got[step] == reference[step], f"step {step} differs"
    assert reference[4] != reference[5]  # the steps really differ from each other


@pytest.mark.parametrize("role", ["actor", "rollout", "critic"])
def test_stateful_service_killed_mid_run(role, reference, tmp_path):
    out, run_dir, summary = killed_run(tmp_path, role)
    (ckpt,) = summary["recovered_from"]
    assert ckpt.endswith(("global_step_2", "global_step_4", "global_step_6")), ckpt
    assert f"going on from {ckpt}" in out
    assert_same_steps(run_dir, reference)


def test_reward_service_killed_mid_run_is_restarted_and_the_call_sent_again(reference, tmp_path):
    out, run_dir, summary = killed_run(tmp_path, "reward")
    assert "recovered_from" not in summary and "going on from" not in out  # nothing went back
    assert_same_steps(run_dir, reference)


def test_second_rank_of_a_two_rank_actor_killed_mid_run(reference_two_ranks, tmp_path):
    out, run_dir, summary = killed_run(tmp_path, "actor", rank=1, extra=TWO_RANK_ACTOR)
    log = open(os.path.join(run_dir, "logs", "actor.log")).read()
    assert '"service.rank_lost"' in log  # rank 0 noticed and exited; the launcher restarted both
    assert len(summary["recovered_from"]) == 1
    assert_same_steps(run_dir, reference_two_ranks)


def test_a_death_past_max_restarts_stops_the_run_naming_the_service(tmp_path):
    rc, out, err, run_dir, _ = run_and_kill([*RECOVERY, "trainer.max_restarts=0", f"trainer.default_local_dir={tmp_path}",
                                             "trainer.experiment_name=no_restarts"], "critic", 0, after_step=1)
    assert rc == 1, f"exit {rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}"
    assert "tandem: run stopped: the critic service died (killed by SIGKILL; log " in err, err[-3000:]
    assert "trainer.max_restarts=0 restarts" in err and "Traceback" not in err
