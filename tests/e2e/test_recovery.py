"""Crash recovery end to end: kill -9 each service mid-run, one after another in one run (the actor's
rank 0, the critic, the standalone rollout, the reward service, then the actor's second rank), then
hang the actor (SIGSTOP of its second rank: rank 0 waits on it in the next call while its health
still answers); the run restarts each (the hung actor once its call ran past the deadline measured
from its earlier calls), goes back to its latest checkpoint (the reward service: sends the failed
call again) and completes, and every RL step's metrics (every key but wall-clock timings) equal
those of an uninterrupted run of the same config (tests/e2e/conftest.py: PPO, every piece of state),
with one line per step in metrics.jsonl (each restart counted in a step's own line). A death past
trainer.max_restarts stops the run naming the service."""
import json
import os
import re
import signal

from conftest import PPO_STATEFUL, STEPS
from kill_runs import metric_lines, run_and_kill, step_metrics

# (role, rank, kill once this step is logged): each after the previous one's recovery
KILLS = [("actor", 0, 2), ("critic", 0, 3), ("rollout", 0, 4), ("reward", 0, 5), ("actor", 1, 6)]
# then the actor hangs: step 7 was the restarted actor's first call of each method (its warm-up, on the
# configured timeout); step 8's calls have measured deadlines, at least a tenth of services.rpc_timeout_s
HANG = ("actor", 1, 7, signal.SIGSTOP)
RPC_TIMEOUT_S = 100
STATEFUL = [role for role, _, _ in KILLS if role != "reward"] + ["actor"]  # these go back to a checkpoint


def test_each_service_killed_or_hung_mid_run_is_recovered_exactly(ppo_reference, tmp_path):
    n_restarts = len(KILLS) + 1
    rc, out, err, run_dir, killed = run_and_kill(
        [*PPO_STATEFUL, f"trainer.max_restarts={n_restarts}", f"trainer.default_local_dir={tmp_path}",
         f"services.rpc_timeout_s={RPC_TIMEOUT_S}", "trainer.experiment_name=kills"], [*KILLS, HANG], timeout_s=600)
    assert rc == 0, f"exit {rc}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    assert len(set(killed)) == n_restarts
    died = [line for line in out.splitlines() if " service died " in line]
    assert [line.split(" service died")[0].rsplit(" ", 1)[1] for line in died] == [r for r, _, _ in KILLS], died
    assert all(f"restart {i} of {n_restarts}" in line for i, line in enumerate(died, start=1)), died
    hung = [line for line in out.splitlines() if " did not answer " in line]
    assert len(hung) == 1 and f"restart {n_restarts} of {n_restarts}" in hung[0], hung
    found = re.fullmatch(r"tandem: the actor service did not answer ActorService\.(\w+) within ([\d.]+) s "
                         r"\(expected ~([\d.e-]+) s\); restarting it \(restart \d+ of \d+\)", hung[0])
    assert found, hung[0]
    assert float(found.group(2)) == RPC_TIMEOUT_S / 10 and float(found.group(3)) < 2, hung[0]  # a tiny model's call
    summary = json.loads(open(os.path.join(run_dir, "summary.json")).read())
    assert summary["restarts"] == n_restarts
    # the stateful services went back to a checkpoint each time; the reward service's call was sent again
    assert len(summary["recovered_from"]) == len(STATEFUL), summary["recovered_from"]
    for ckpt in summary["recovered_from"]:
        assert os.path.basename(ckpt) in {f"global_step_{s}" for s in range(0, STEPS + 1, 2)}, ckpt
        assert f"going on from {ckpt}" in out
    log = open(os.path.join(run_dir, "logs", "actor.log")).read()
    assert '"service.rank_lost"' in log  # rank 1's death: rank 0 noticed and exited; both restarted
    got = step_metrics(run_dir)  # (one line per step, restarts and the final validation in theirs)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in ppo_reference:
        assert got[step] == ppo_reference[step], f"step {step} differs"
    restarts = [m for m in metric_lines(run_dir) if "trainer/restarts" in m]
    assert restarts and all("actor/pg_loss" in m or "val/accuracy" in m for m in restarts), restarts  # step lines
    assert max(m["trainer/restarts"] for m in restarts) == n_restarts
    assert "val/accuracy" in metric_lines(run_dir)[-1] and metric_lines(run_dir)[-1]["step"] == STEPS


def test_a_death_past_max_restarts_stops_the_run_naming_the_service(tmp_path):
    rc, out, err, run_dir, _ = run_and_kill([*PPO_STATEFUL, "trainer.max_restarts=0", "services.actor.world_size=1",
                                             f"trainer.default_local_dir={tmp_path}",
                                             "trainer.experiment_name=no_restarts"], [("critic", 0, 1)])
    assert rc == 1, f"exit {rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}"
    assert "tandem: run stopped: the critic service died (killed by SIGKILL; log " in err, err[-3000:]
    assert "trainer.max_restarts=0 restarts" in err and "Traceback" not in err
