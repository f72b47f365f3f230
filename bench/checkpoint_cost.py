"""What a run checkpoint costs against an RL step: the trade-off behind `trainer.save_freq`.

Runs `tandem run` with a checkpoint after every step (`trainer.save_freq=1`) and the given
overrides, then reads the seconds of each save (the actor's and the critic's SaveCheckpoint,
from the services' logs; the controller's own file is negligible) and of each RL step
(`timing_s/step` in metrics.jsonl), leaving out the first of each (one-time warm-up). Prints
both, the ratio, and the share of the run's time spent saving at a few `save_freq` values.

    python bench/checkpoint_cost.py                                        # built-in task, CPU, tiny
    python bench/checkpoint_cost.py actor_rollout_ref.model.path=/models/Qwen2.5-0.5B \\
        actor_rollout_ref.actor.megatron.dtype=bfloat16 data.train_files=... data.val_files=...   # on a GPU
"""
from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 8
SMALL = ["trainer.sft.total_steps=3", "trainer.sft.batch_size=8", "data.train_batch_size=8",
         "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
         "critic.ppo_mini_batch_size=4", "data.builtin_train_size=400", "data.builtin_val_size=16",
         "algorithm.adv_estimator=gae", "trainer.test_freq=0"]


def save_seconds(run_dir: str) -> list[float]:
    """Seconds of each whole save: the actor's and the critic's SaveCheckpoint (sequential), by step."""
    per_step: dict[str, float] = {}
    for role in ("actor", "critic"):
        path = os.path.join(run_dir, "logs", f"{role}.log")
        if not os.path.exists(path):
            continue
        for line in open(path, errors="replace"):
            if '"rpc"' in line and "SaveCheckpoint" in line:
                e = json.loads(line)
                if e.get("rank", 0) == 0 and e.get("step") is not None:
                    per_step[e["step"]] = per_step.get(e["step"], 0.0) + e["ms"] / 1e3
    return [per_step[k] for k in sorted(per_step, key=int)]


def main() -> int:
    overrides = sys.argv[1:] or SMALL
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs; overrides: {' '.join(overrides)}")
    with tempfile.TemporaryDirectory(prefix="tandem-ckpt-cost-") as tmp:
        cmd = [sys.executable, "-m", "tandem.controller", "run", *overrides, f"trainer.total_training_steps={STEPS}",
               "trainer.save_freq=1", "trainer.logger=[jsonl]", f"trainer.default_local_dir={tmp}",
               "trainer.experiment_name=ckpt_cost"]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=ROOT))
        found = re.search(r"tandem: run directory (\S+)", proc.stdout)
        if proc.returncode != 0 or not found:
            print(proc.stdout[-2000:], proc.stderr[-3000:])
            return 1
        run_dir = found.group(1)
        steps = [json.loads(x)["timing_s/step"] for x in open(os.path.join(run_dir, "metrics.jsonl"))
                 if "timing_s/step" in x]
        saves = save_seconds(run_dir)
    step_s, save_s = statistics.median(steps[1:]), statistics.median(saves[1:])
    print(f"RL step: {step_s:.3f} s (median of {len(steps) - 1}); checkpoint: {save_s:.3f} s "
          f"(median of {len(saves) - 1}; first save {saves[0]:.3f} s)")
    print(f"a checkpoint costs {save_s / step_s:.2f} RL steps")
    for freq in (1, 5, 10, 20, 50):
        print(f"  save_freq={freq:3d}: {100 * save_s / (save_s + freq * step_s):5.1f}% of the run's time in saves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
