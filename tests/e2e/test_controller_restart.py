"""kill -9 of the controller service mid-run, then a restart on the same state directory: the
records are intact, the services (which outlive it) are reattached and given back, the
interrupted run resumes from its checkpoint and logs the same metrics for the steps after it
as an uninterrupted run; a run whose config says `trainer.on_controller_restart=fail` is
failed instead, and a queued run stays queued and then runs."""
import os

from controller_proc import ControllerProcess, step_metrics
from test_tandem_run import TINY

PPO = ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.mode=standalone", "algorithm.use_kl_in_reward=true",
       "algorithm.kl_ctrl.type=adaptive", "trainer.logger=[jsonl]", "trainer.save_freq=1"]
STEPS = 6


def test_kill_9_then_restart(tmp_path):
    runs = tmp_path / "runs"
    common = [*TINY, *PPO, f"trainer.default_local_dir={runs}", f"trainer.total_training_steps={STEPS}"]
    ctl = ControllerProcess(tmp_path / "state", start_roles="actor,reward,rollout,critic").start()
    try:
        resumed = ctl.client.submit("", [*common, "trainer.experiment_name=resumed"])["id"]
        failing = ctl.client.submit("", [*common, "trainer.experiment_name=failing", "trainer.total_training_steps=60",
                                         "trainer.on_controller_restart=fail"])["id"]
        ctl.wait_for(resumed, lambda r: 2 <= r["last_step"] < STEPS, what="mid-run")
        pool_before = ctl.pool()
        ctl.kill9()

        ctl = ControllerProcess(tmp_path / "state", log_name="controller2.log").start()
        assert ctl.pool() == pool_before  # the same service processes, reattached
        record = ctl.wait_ended(resumed)
        assert record["state"] == "succeeded", record["error"]
        ckpt = record["resumed_from"]
        assert os.path.dirname(os.path.dirname(ckpt)) == record["run_dir"], ckpt
        resumed_step = int(ckpt.rsplit("_", 1)[1])
        assert 1 <= resumed_step < STEPS

        # the second run now runs; a third is queued behind it when the controller dies again
        ctl.wait_for(failing, lambda r: r["last_step"] >= 1, what="running")
        reference = ctl.client.submit("", [*common, "trainer.experiment_name=reference"])["id"]
        ctl.kill9()

        ctl = ControllerProcess(tmp_path / "state", log_name="controller3.log").start()
        record = ctl.client.get(failing)[0]
        assert record["state"] == "failed" and "controller restarted" in record["error"]
        assert ctl.pool() == pool_before
        ref = ctl.wait_ended(reference)
        assert ref["state"] == "succeeded", ref["error"]

        got, want = step_metrics(ctl.client.get(resumed)[0]["run_dir"]), step_metrics(ref["run_dir"])
        assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
        for step in range(resumed_step + 1, STEPS + 1):
            assert got[step] == want[step], f"step {step} differs after resuming from step {resumed_step}"
        assert want[STEPS - 1] != want[STEPS]  # the steps really differ

        # every record survived both kills, in order
        states = {r["id"]: r["state"] for r in ctl.client.list()}
        assert states == {resumed: "succeeded", failing: "failed", reference: "succeeded"}
        logs = [e["body"] for e in ctl.client.events(resumed) if e["kind"] == "log"]
        assert any("queued again, to resume from" in line for line in logs)
    finally:
        ctl.stop()
