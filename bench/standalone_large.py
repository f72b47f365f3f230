"""A standalone rollout at a size the old single-message sync could not move (> 512 MiB), end to end.

    python bench/standalone_large.py [--hidden 1024 --layers 12] [--steps 2] [--modes standalone,colocated]
        [--timeout-s S] [--out DIR] [extra dotted overrides]

Runs `tandem run` twice on the built-in task with a built-in model shape of that size (fp32 on
CPU: hidden 1024 x 12 layers is 0.75 GB of weights; no SFT warm start by default, whose
optimizer would cost another 1.5 GB): once with a standalone rollout (a separate service
process that pulls the actor's weights over the weight plane before the first step and after
every update) and once colocated (the actor generates on its own
weights). Prints, per run, the per-step `training/rollout_probs_diff_max` (how far the
rollout's token probabilities are from the actor's recomputation; a stale or mis-synced
rollout shows ~0.1-1) and the weight-sync metrics, and fails unless the standalone run's is as
small as the colocated run's (at most 1.5x it, or below 1e-4: fp32 on CPU gives ~1e-6, bf16 more). On a GPU machine add e.g.
`actor_rollout_ref.actor.megatron.dtype=bfloat16`. Each run is its own process, printed when
done; one that fails or passes --timeout-s is reported and the other still runs. No checkpoints
mid-run (trainer.save_freq=0); the run's final checkpoint is deleted after it. With --out the
two modes can run in two calls (`--modes colocated`, then `--modes standalone`): the second
compares against the first's results.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(mode: str, a, out: str) -> list[dict] | None:
    """One `tandem run` in its own process -> its RL steps' metrics (None: it failed or ran past
    --timeout-s; reported, and the other mode still runs). Its checkpoints are deleted after it (at
    1.5B the final one is ~20 GB: two runs' would fill a small disk); metrics and logs are kept."""
    overrides = [
        f"actor_rollout_ref.rollout.mode={mode}", f"trainer.default_local_dir={out}", f"trainer.experiment_name={mode}",
        f"actor_rollout_ref.model.hidden_size={a.hidden}", f"actor_rollout_ref.model.num_hidden_layers={a.layers}",
        f"actor_rollout_ref.model.num_attention_heads={a.hidden // 64}",
        f"actor_rollout_ref.model.num_key_value_heads={a.hidden // 128}",
        f"actor_rollout_ref.model.intermediate_size={4 * a.hidden}",
        f"trainer.sft.total_steps={a.sft_steps}", f"trainer.total_training_steps={a.steps}", "trainer.test_freq=0",
        "trainer.save_freq=0", "trainer.sft.batch_size=8", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "data.builtin_train_size=200", "data.builtin_val_size=8",
        "trainer.logger=[console,jsonl]", "services.startup_timeout_s=600", *a.overrides]
    t0 = time.time()
    pythonpath = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))  # keep the caller's (GPU wheels)
    try:
        proc = subprocess.run([sys.executable, "-m", "tandem.controller", "run", *overrides], cwd=ROOT,
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=pythonpath), check=False,
                              timeout=a.timeout_s or None)
    except subprocess.TimeoutExpired as e:
        print(f"{mode}: did not finish within --timeout-s {a.timeout_s} s\n{_tail(e.stdout)}\n{_tail(e.stderr)}",
              flush=True)
        return None
    finally:
        for ckpt in glob.glob(os.path.join(out, f"{mode}-*", "checkpoints")):
            shutil.rmtree(ckpt, ignore_errors=True)
    if proc.returncode:
        print(f"{mode} run failed ({proc.returncode}) after {time.time() - t0:.0f} s:\n{_tail(proc.stdout)}\n"
              f"{_tail(proc.stderr)}", flush=True)
        return None
    path = max(glob.glob(os.path.join(out, f"{mode}-*", "metrics.jsonl")), key=os.path.getmtime)  # this call's
    with open(path) as f:
        steps = [m for m in map(json.loads, f) if "actor/pg_loss" in m]
    syncs = []  # the rollout's own log of each sync: transport, bytes, seconds, transfer seconds
    for log in glob.glob(os.path.join(os.path.dirname(path), "logs", "rollout*.log")):
        with open(log) as f:
            syncs += [e for e in map(_json_or_none, f) if e and e.get("event") == "weights.synced"]
    print(f"{mode}: {time.time() - t0:.0f} s", flush=True)
    for e in syncs:
        print(f"  sync to version {e['version']}: {e['transport']}, {e['bytes'] / 1e9:.3f} GB in {e['seconds']:.3f} s "
              f"(transfer {e['transfer_s']:.3f} s)")
    print(f"  rollout_probs_diff_max per step: {[round(m['training/rollout_probs_diff_max'], 6) for m in steps]}",
          flush=True)
    with open(os.path.join(out, f"{mode}.json"), "w") as f:
        json.dump({"wall_s": time.time() - t0, "steps": steps, "syncs": syncs}, f, indent=1)
    return steps


def _tail(text, n: int = 3000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-n:]


def _json_or_none(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--sft-steps", type=int, default=0, help="SFT warm-start steps (its optimizer costs memory)")
    p.add_argument("--min-bytes", type=int, default=512 << 20, help="a sync must move more (the old message cap)")
    p.add_argument("--modes", default="standalone,colocated", help="which runs, in this order")
    p.add_argument("--timeout-s", type=float, default=0, help="per run (0: none); a run past it is reported")
    p.add_argument("--out", help="keep the runs (metrics, logs; checkpoints deleted) and MODE.json here; a mode "
                   "not run now is read from an earlier call's MODE.json there (one mode per call, then compare)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    params = a.layers * (a.hidden * 2 * a.hidden + a.hidden * a.hidden + 3 * a.hidden * 4 * a.hidden)
    if not any(o.startswith("actor_rollout_ref.model.path=") for o in a.overrides):
        print(f"model: hidden {a.hidden} x {a.layers} layers, about {params / 1e6:.0f}M parameters "
              f"({params * 4 / 1e9:.2f} GB in fp32)", flush=True)
    results = {}
    with contextlib.ExitStack() as stack:
        out = a.out or stack.enter_context(tempfile.TemporaryDirectory())
        os.makedirs(out, exist_ok=True)
        for mode in filter(None, a.modes.split(",")):
            if mode not in ("standalone", "colocated"):
                sys.exit(f"--modes: {mode!r} is not standalone or colocated")
            results[mode] = run(mode, a, out)
        for mode in ("standalone", "colocated"):  # the other mode from an earlier call with the same --out
            if mode not in results and os.path.exists(os.path.join(out, f"{mode}.json")):
                with open(os.path.join(out, f"{mode}.json")) as f:
                    results[mode] = json.load(f)["steps"]
                print(f"{mode}: from {out}/{mode}.json (an earlier call)")
    standalone, colocated = results.get("standalone"), results.get("colocated")
    if not standalone or not colocated:
        print(f"\nno comparison: {[m for m, r in results.items() if not r]} did not finish")
        return 1
    print("\n| step | standalone rollout_probs_diff_max | colocated rollout_probs_diff_max | weight_sync/bytes "
          "| timing_s/weight_sync | perf/weight_sync_gbps | rollout/weights_version |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for s, c in zip(standalone, colocated):
        print(f"| {s['step']} | {s['training/rollout_probs_diff_max']:.3g} | {c['training/rollout_probs_diff_max']:.3g} "
              f"| {s['weight_sync/bytes'] / 1e9:.3f} GB | {s['timing_s/weight_sync']:.2f} s "
              f"| {s['perf/weight_sync_gbps']:.2f} | {s['rollout/weights_version']:.0f} |")
    worst = max(m["training/rollout_probs_diff_max"] for m in standalone)
    bound = max(1e-4, 1.5 * max(m["training/rollout_probs_diff_max"] for m in colocated))  # bf16: the colocated's
    ok = worst <= bound and all(m["weight_sync/bytes"] > a.min_bytes for m in standalone)
    print(f"\nstandalone max rollout_probs_diff_max {worst:.3g} (bound {bound:.3g}): {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
