"""Held-out accuracy gain and seconds per RL step of each algorithm on the built-in task.

    python bench/algorithms.py [--out runs/bench_algorithms] [--steps 120] [--write-results]

1. One SFT warm start (`tandem run trainer.total_training_steps=0`, the default SFT: until
   the dev-accuracy threshold, `trainer.sft.stop_at_accuracy`), its policy exported as a
   Hugging Face directory (tandem.convert.hf_export, with the run's tokenizer,
   `python -m tandem.services.actor.export`).
2. Each algorithm is a `tandem run` from that directory (`actor_rollout_ref.model.path=...
   trainer.sft.total_steps=0`), so all start from the same weights and the same held-out
   accuracy: GRPO (the default), RLOO, REINFORCE++, PPO (deploy/configs/arithmetic_ppo.yaml,
   GAE with a critic service) and DAPO (deploy/configs/arithmetic_dapo.yaml).
3. A table: held-out greedy accuracy (256 prompts) before and after RL, the gain, mean
   seconds per RL step (metrics.jsonl timing_s/step), and for DAPO the prompt groups its
   dynamic sampling dropped. `--write-results` appends it to bench/results/learning.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGORITHMS = {  # name -> tandem run arguments (after the shared ones)
    "GRPO": ["algorithm.adv_estimator=grpo"],
    "RLOO": ["algorithm.adv_estimator=rloo"],
    "REINFORCE++": ["algorithm.adv_estimator=reinforce_plus_plus"],
    "PPO (GAE + critic)": [os.path.join(ROOT, "deploy/configs/arithmetic_ppo.yaml")],
    "DAPO (GRPO + dynamic sampling)": [os.path.join(ROOT, "deploy/configs/arithmetic_dapo.yaml")],
}


def tandem_run(args: list[str], out: str, name: str) -> str:
    """Run `tandem run` (a config file first if given); return its run directory."""
    base = os.path.join(out, name)
    os.makedirs(base, exist_ok=True)
    config = [a for a in args if a.endswith(".yaml")]
    rest = [a for a in args if not a.endswith(".yaml")]
    cmd = [sys.executable, "-m", "tandem.controller", "run", *config, *rest,
           f"trainer.default_local_dir={base}", f"trainer.experiment_name={name}", "trainer.logger=[jsonl]"]
    print("+", " ".join(cmd[2:]), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    (run_dir,) = [os.path.join(base, d) for d in os.listdir(base) if os.path.isdir(os.path.join(base, d))]
    return run_dir


def read_run(run_dir: str) -> dict:
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    lines = [json.loads(x) for x in open(os.path.join(run_dir, "metrics.jsonl"))]
    steps = [m for m in lines if "actor/pg_loss" in m]
    times = sorted(m["timing_s/step"] for m in steps)
    return {"s_per_step_median": times[len(times) // 2],"before": summary["val_accuracy_after_sft"], "after": summary["val_accuracy_final"],
            "gain": summary["rl_gain"], "s_per_step": sum(m["timing_s/step"] for m in steps) / len(steps),
            "steps": len(steps), "rl_time_s": summary["rl_time_s"],
            "dropped": sum(m.get("train/num_dropped_groups", 0) for m in steps) if any(
                "train/num_dropped_groups" in m for m in steps) else None,
            "gen_batches": sum(m.get("train/num_gen_batches", 0) for m in steps)}


def machine() -> str:
    import torch

    load = os.getloadavg()
    return (f"{platform.machine()}, nproc {os.cpu_count()}, python {platform.python_version()}, "
            f"torch {torch.__version__}, loadavg {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def table(rows: dict[str, dict], steps: int) -> str:
    out = ["| algorithm | before RL | after RL | gain | s / RL step (median) | (mean) | dropped groups (DAPO) |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in rows.items():
        dropped = "-" if r["dropped"] is None else (
            f"{r['dropped']:.0f} over {steps} steps ({r['gen_batches']:.0f} generation rounds)")
        out.append(f"| {name} | {r['before']:.3f} | {r['after']:.3f} | {r['gain']:+.3f} | "
                   f"{r['s_per_step_median']:.2f} | {r['s_per_step']:.2f} | {dropped} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_algorithms"))
    p.add_argument("--steps", type=int, default=120, help="RL steps per algorithm")
    p.add_argument("--only", nargs="*", help="algorithm names to run (default: all)")
    p.add_argument("--write-results", action="store_true", help="append the table to bench/results/learning.md")
    p.add_argument("--report-only", action="store_true",
                   help="only print the table of the runs already under --out")
    a = p.parse_args()
    out = os.path.abspath(a.out)
    if a.report_only:
        runs = {name: os.path.join(out, name.split()[0].lower().replace("+", "p")) for name in ALGORITHMS}
        rows = {name: read_run(os.path.join(base, os.listdir(base)[0])) for name, base in runs.items()
                if os.path.isdir(base)}
        print(table(rows, a.steps))
        return
    t0 = time.time()
    start = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine()}
    sft_dir = tandem_run(["trainer.total_training_steps=0"], out, "sft")
    hf_dir = os.path.join(out, "sft_hf")
    subprocess.run([sys.executable, "-m", "tandem.services.actor.export",  # the SFT policy as a HF directory
                    os.path.join(sft_dir, "checkpoints", "global_step_0"), hf_dir], cwd=ROOT, check=True)
    sft_summary = json.load(open(os.path.join(sft_dir, "summary.json")))
    sft_acc, sft_steps = sft_summary["val_accuracy_after_sft"], sft_summary.get("sft_steps")
    print(f"SFT warm start: held-out {sft_acc:.3f}; exported to {hf_dir}", flush=True)
    rows = {}
    for name, args in ALGORITHMS.items():
        if a.only and name.split()[0] not in a.only:
            continue
        run_name = name.split()[0].lower().replace("+", "p")
        run_dir = tandem_run([*args, f"actor_rollout_ref.model.path={hf_dir}", "trainer.sft.total_steps=0",
                              f"trainer.total_training_steps={a.steps}"], out, run_name)
        rows[name] = read_run(run_dir)
        print(name, json.dumps(rows[name]), flush=True)
    text = table(rows, a.steps)
    header = (f"## Algorithms (held-out accuracy gain and seconds per RL step)\n\n"
              f"- date: {start['date']}; wall {time.time() - t0:.0f} s\n"
              f"- command: `python bench/algorithms.py --write-results`\n"
              f"- machine: {start['machine']} at start; "
              f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())} at end\n"
              f"- setup: one SFT warm start ({sft_steps} steps, held-out {sft_acc:.3f}) exported as a Hugging Face "
              f"directory; each algorithm runs {a.steps} RL steps of 128 prompts from it "
              f"(`actor_rollout_ref.model.path=... trainer.sft.total_steps=0`); "
              f"held-out: 256 prompts, greedy, exact match\n")
    print(header + "\n" + text)
    if a.write_results:
        with open(os.path.join(ROOT, "bench", "results", "learning.md"), "a") as f:
            f.write("\n\n" + header + "\n" + text + "\n")


if __name__ == "__main__":
    main()
