"""Learning is not lost to asynchrony: held-out accuracy of sync and async RL from one SFT warm start.

    python bench/async_learning.py [--out runs/bench_async_learning] [--steps 120] [--seeds 1 2 3]
                                   [--mode one_step_off] [--warm-start DIR] [--write-results] [key=value ...]

1. One SFT warm start (`tandem run trainer.total_training_steps=0`, the default SFT), its policy
   exported as a Hugging Face directory (as bench/algorithms.py does).
2. For each seed (`trainer.seed`: the sampling seeds), a synchronous and an asynchronous GRPO run
   from that directory, both with a standalone rollout and the decoupled-PPO correction
   (`actor_rollout_ref.actor.tis_imp_ratio_cap=2`), the same number of steps and prompts
   (on_stale=wait: no batch is dropped, so both train on the same number of samples).
3. A table: held-out greedy accuracy after RL of each, their difference, mean staleness, s/step;
   the means over seeds and whether async is within 3 points of sync. `--write-results` appends it
   to bench/results/async.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from algorithms import ROOT, machine, read_run, tandem_run  # noqa: E402

SHARED = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.mode=standalone",
          "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0", "trainer.sft.total_steps=0"]


def staleness(run_dir: str) -> float:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [m for m in map(json.loads, f) if "actor/pg_loss" in m]
    return statistics.mean(m.get("async/staleness_mean", 0.0) for m in steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_async_learning"))
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--mode", default="one_step_off", choices=["one_step_off", "fully_async"])
    p.add_argument("--warm-start", help="an exported SFT policy (a previous call's OUT/sft_hf) instead of a new SFT")
    p.add_argument("--write-results", action="store_true")
    p.add_argument("overrides", nargs="*", help="dotted keys for every run (the SFT run too)")
    a = p.parse_args()
    out, t0 = os.path.abspath(a.out), time.time()
    start = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine()}
    hf_dir = a.warm_start or os.path.join(out, "sft_hf")
    if not a.warm_start:
        sft_dir = tandem_run(["trainer.total_training_steps=0", *a.overrides], out, "sft")
        subprocess.run([sys.executable, "-m", "tandem.services.actor.export",
                        os.path.join(sft_dir, "checkpoints", "global_step_0"), hf_dir], cwd=ROOT, check=True)
    rows = []
    for seed in a.seeds:
        row = {"seed": seed}
        for mode in ("sync", a.mode):
            run_dir = tandem_run([*SHARED, f"actor_rollout_ref.model.path={hf_dir}", f"trainer.seed={seed}",
                                  f"trainer.total_training_steps={a.steps}", f"async_training.mode={mode}",
                                  *a.overrides], out, f"{mode}_seed{seed}")
            row[mode] = {**read_run(run_dir), "staleness": staleness(run_dir)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    lines = ["| seed | before RL | sync after RL | async after RL | async - sync | async staleness (mean) | s / step sync | async |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        s, x = r["sync"], r[a.mode]
        lines.append(f"| {r['seed']} | {s['before']:.3f} | {s['after']:.3f} | {x['after']:.3f} | "
                     f"{x['after'] - s['after']:+.3f} | {x['staleness']:.2f} | {s['s_per_step']:.2f} | {x['s_per_step']:.2f} |")
    sync_mean = statistics.mean(r["sync"]["after"] for r in rows)
    async_mean = statistics.mean(r[a.mode]["after"] for r in rows)
    verdict = "within" if async_mean >= sync_mean - 0.03 else "NOT within"
    text = "\n".join(lines) + (f"\n\nMean after RL: sync {sync_mean:.3f}, {a.mode} {async_mean:.3f} "
                               f"({async_mean - sync_mean:+.3f}: {verdict} 3 points).")
    header = (f"## Asynchronous RL: learning against synchronous ({a.mode}, staleness 1)\n\n"
              f"- date: {start['date']}; wall {time.time() - t0:.0f} s; machine: {start['machine']} at start\n"
              f"- command: `python bench/async_learning.py --steps {a.steps} --seeds {' '.join(map(str, a.seeds))} "
              f"{' '.join(a.overrides)}`\n"
              f"- setup: one SFT warm start exported as a Hugging Face directory; GRPO with a standalone "
              f"rollout and tis_imp_ratio_cap=2 both ways, {a.steps} RL steps each; held-out greedy accuracy\n")
    print(header + "\n" + text)
    if a.write_results:
        with open(os.path.join(ROOT, "bench", "results", "async.md"), "a") as f:
            f.write("\n\n" + header + "\n" + text + "\n")


if __name__ == "__main__":
    main()
