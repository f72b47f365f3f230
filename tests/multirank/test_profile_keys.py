"""verl's `profile` keys through a real `tandem run` (gloo ranks on CPU): torch.profiler traces
appear exactly for the chosen roles, ranks and RL steps, named <role>_rank<r>_step<s>.json under
the run directory; bad values are ConfigErrors naming the key. The run also shows that
`trainer.save_freq=-1` (verl's value) leaves no checkpoint at all."""
import json
import os
import subprocess
import sys

import pytest

from tandem.config import ConfigError, load_config

RUN = ["trainer.sft.total_steps=0", "trainer.total_training_steps=3", "data.train_batch_size=4",
       "actor_rollout_ref.rollout.n=2", "data.builtin_train_size=64", "data.builtin_val_size=4",
       "actor_rollout_ref.actor.ppo_mini_batch_size=2", "critic.ppo_mini_batch_size=2", "trainer.test_freq=0",
       "data.max_prompt_length=16", "data.max_response_length=4", "trainer.logger=[console,jsonl]",
       "services.actor.torch_threads=1", "algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.mode=standalone",
       "services.actor.world_size=2", "trainer.max_restarts=0", "trainer.save_freq=-1"]
PROFILE = {  # section: (ranks, start, end) -> the traces expected, by role
    "actor_rollout_ref.actor.profile": ("[1]", 2, 4),
    "critic.profile": ("null", 1, 2),
    "actor_rollout_ref.rollout.profile": ("[0]", 3, 5),  # step 4 is past the run's 3 steps: no trace
}
EXPECTED = {"actor_rank1_step2.json", "actor_rank1_step3.json", "critic_rank0_step1.json", "rollout_rank0_step3.json"}


def _keys(profile=PROFILE) -> list[str]:
    out = []
    for key, (ranks, start, end) in profile.items():
        out += [f"{key}.use_profile=true", f"{key}.profile_ranks={ranks}", f"{key}.step_start={start}",
                f"{key}.step_end={end}"]
    return out


def test_traces_exactly_for_the_chosen_roles_ranks_and_steps(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tandem.controller", "run", *RUN, *_keys(),
                           f"trainer.default_local_dir={tmp_path}"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [tmp_path / d for d in os.listdir(tmp_path)]
    assert set(os.listdir(run_dir / "profile")) == EXPECTED
    assert not (run_dir / "checkpoints").exists()  # save_freq=-1: none, not even the critic's start
    for name in EXPECTED:
        events = json.loads((run_dir / "profile" / name).read_text())["traceEvents"]
        role = name.split("_rank")[0]
        calls = {e["name"] for e in events if e.get("cat") == "user_annotation"}
        assert any(c.startswith(f"{role}.") for c in calls), f"{name}: no {role}.<method> call range in {calls}"
        assert any(e.get("cat") == "cpu_op" for e in events), f"{name}: no torch ops recorded"


@pytest.mark.parametrize("override,key", [
    ("actor_rollout_ref.actor.profile.profile_ranks=[2]", "actor_rollout_ref.actor.profile.profile_ranks"),
    ("actor_rollout_ref.actor.profile.profile_ranks=[]", "actor_rollout_ref.actor.profile.profile_ranks"),
    ("actor_rollout_ref.actor.profile.step_start=0", "actor_rollout_ref.actor.profile.step_start"),
    ("actor_rollout_ref.actor.profile.step_end=2", "actor_rollout_ref.actor.profile.step_end"),
    ("critic.profile.step_end=1", "critic.profile.step_end"),
    ("actor_rollout_ref.ref.profile.use_profile=true", "actor_rollout_ref.ref.profile.use_profile"),
])
def test_bad_values_name_the_key(override, key):
    good = ["services.actor.world_size=2", "actor_rollout_ref.actor.profile.use_profile=true",
            "actor_rollout_ref.actor.profile.step_start=2", "actor_rollout_ref.actor.profile.step_end=4",
            "critic.profile.use_profile=true", "critic.profile.step_start=1", "critic.profile.step_end=2"]
    load_config(None, good)  # the good values load
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [*good, override])
