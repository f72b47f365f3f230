"""What several e2e files share: one uninterrupted PPO run whose step metrics the crash-recovery and
resume tests compare against (tests/e2e/test_recovery.py, test_resume.py), run once per session.

PPO with a critic, a standalone rollout, the adaptive KL controller in the reward and the actor at two
data-parallel ranks, so every piece of state (policy, reference, optimizers, critic, rollout weights,
data cursor, KL controller, both ranks) must come back exactly."""
import pytest
from kill_runs import step_metrics  # tests/helpers
from test_tandem_run import TINY, run_tandem

STEPS = 8
PPO_STATEFUL = [*TINY, "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.mode=standalone",
                "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "trainer.logger=[jsonl]",
                "services.actor.world_size=2", f"trainer.total_training_steps={STEPS}", "trainer.save_freq=2"]


@pytest.fixture(scope="session")
def ppo_reference(tmp_path_factory) -> dict[int, dict]:
    """{step: metrics but wall-clock ones} of PPO_STATEFUL run without interruption."""
    root = tmp_path_factory.mktemp("ppo_reference")
    rc, out, err, _ = run_tandem([*PPO_STATEFUL, f"trainer.default_local_dir={root}",
                                  "trainer.experiment_name=whole"], timeout_s=400)
    assert rc == 0, f"exit {rc}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-3000:]}"
    (run_dir,) = root.iterdir()
    steps = step_metrics(run_dir)
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert steps[4] != steps[5]  # the steps really differ from each other
    return steps
