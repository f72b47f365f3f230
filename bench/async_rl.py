"""Asynchronous vs synchronous RL steps: the same config run both ways in one call, steps/s and ratio.

Each run is a real `tandem run` (actor, standalone rollout and reward as their own processes,
started by the local launcher) with async_training.mode=sync, then with the async mode asked for;
runs alternate (sync, async, sync, async, ...) so that load from other users of the machine hits
both alike. steps/s = RL steps / summary.json's rl_time_s (the RL loop only: services' start, the
warm start and the final validation are left out). Printed: every run, the medians, their ratio
(async / sync), the async runs' mean staleness and dropped batches, the load average before and
after, and the machine.

    python bench/async_rl.py [--rounds 2] [--steps 12] [--mode one_step_off] [key=value ...]

Defaults (CPU, 2 cores): a 256-wide built-in model, no SFT, 16 prompts x 4 samples a step, each
service on one thread (services.*.torch_threads=1), so that the synchronous run leaves one core
idle while the other works. On one GPU with actor and rollout as two processes sharing it:

    python bench/async_rl.py --gpu services.actor.gpu_memory_fraction=0.45 \\
        services.rollout.gpu_memory_fraction=0.45 services.actor.devices=0 services.rollout.devices=0
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

CPU = ["actor_rollout_ref.model.hidden_size=256", "actor_rollout_ref.model.intermediate_size=1024",
       "actor_rollout_ref.model.num_attention_heads=8", "actor_rollout_ref.model.num_key_value_heads=4",
       "actor_rollout_ref.model.max_position_embeddings=64", "data.max_prompt_length=16",
       "data.max_response_length=32", "services.actor.torch_threads=1", "services.rollout.torch_threads=1"]
COMMON = ["actor_rollout_ref.rollout.mode=standalone", "algorithm.adv_estimator=grpo", "trainer.sft.total_steps=0",
          "data.train_batch_size=16", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
          "data.builtin_val_size=8", "trainer.test_freq=0", "trainer.logger=[jsonl]",
          "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0"]


def one_run(overrides: list[str], workdir: str, name: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tandem.controller", "run", *overrides,
                           f"trainer.default_local_dir={workdir}", f"trainer.experiment_name={name}"],
                          check=False, capture_output=True, text=True)
    found = re.search(r"tandem: run directory (\S+)", proc.stdout)
    if proc.returncode != 0 or not found:
        sys.exit(f"tandem run {name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    run_dir = found.group(1)
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [m for m in map(json.loads, f) if "actor/pg_loss" in m]
    return {"steps_per_s": len(steps) / summary["rl_time_s"], "steps": len(steps),
            "staleness": statistics.mean(m.get("async/staleness_mean", 0.0) for m in steps),
            "dropped": max((m.get("async/dropped_batches", 0.0) for m in steps), default=0.0),
            "gen_s": statistics.median(m["timing_s/gen"] for m in steps),
            "update_s": statistics.median(m["timing_s/update_actor"] for m in steps),
            "sync_s": statistics.mean(syncs) if (syncs := [m["timing_s/weight_sync"] for m in steps
                                                           if "timing_s/weight_sync" in m]) else 0.0,
            "producer_idle_s": statistics.mean(m.get("async/producer_idle_s", 0.0) for m in steps),
            "consumer_idle_s": statistics.mean(m.get("async/consumer_idle_s", 0.0) for m in steps)}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        import torch
        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPUs ({cpu})"
    except ImportError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--mode", default="one_step_off", choices=["one_step_off", "fully_async"])
    p.add_argument("--gpu", action="store_true", help="leave out the CPU sizes (the built-in model and your keys)")
    p.add_argument("overrides", nargs="*", help="dotted keys as for tandem run (after the defaults)")
    args = p.parse_args()
    base = [*COMMON, *([] if args.gpu else CPU), f"trainer.total_training_steps={args.steps}", *args.overrides]
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {"sync": [], args.mode: []}
    with tempfile.TemporaryDirectory(prefix="tandem-async-bench-") as workdir:
        for r in range(args.rounds):
            for mode, results in runs.items():
                res = one_run([*base, f"async_training.mode={mode}"], workdir, f"{mode}-{r}")
                results.append(res)
                print(f"round {r} {mode:>13}: {res['steps_per_s']:.3f} steps/s ({res['steps']} steps; gen "
                      f"{res['gen_s']:.2f} s, update {res['update_s']:.2f} s, sync {res['sync_s']:.3f} s a step; "
                      f"idle: producer {res['producer_idle_s']:.2f} s, consumer {res['consumer_idle_s']:.2f} s; staleness "
                      f"{res['staleness']:.2f}, dropped {res['dropped']:.0f}; load {os.getloadavg()[0]:.2f})", flush=True)
    sync = statistics.median(x["steps_per_s"] for x in runs["sync"])
    fast = statistics.median(x["steps_per_s"] for x in runs[args.mode])
    paired = statistics.median(a["steps_per_s"] / s["steps_per_s"] for s, a in zip(runs["sync"], runs[args.mode]))
    print(f"\nsync {sync:.3f} steps/s, {args.mode} {fast:.3f} steps/s: ratio {fast / sync:.2f}x "
          f"(medians of {args.rounds} runs each); median of the rounds' ratios {paired:.2f}x")
    print(f"load average (1 min) before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; machine: {machine()}")
    print("config:", " ".join(base))


if __name__ == "__main__":
    main()
