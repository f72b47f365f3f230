"""Same behaviour across refactors: run a config for a few RL steps and compare its
metrics.jsonl (every non-timing key) with a golden file made from earlier code.

    python tests/golden/metrics_golden.py write default     # from the code before a change
    python tests/golden/metrics_golden.py check default     # after it: exit 1 on any difference

Cases: `default` (the built-in GRPO run) and `ppo` (deploy/configs/arithmetic_ppo.yaml),
20 RL steps each. Bit-for-bit equality holds on one machine and thread count (CPU
arithmetic differs between CPU models), so this is a script for the machine that wrote
the golden file, not a CI test.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CASES = {
    "default": [],
    "ppo": [os.path.join(ROOT, "deploy", "configs", "arithmetic_ppo.yaml")],
}
STEPS = 20
VOLATILE_PREFIXES = ("timing_s/", "perf/throughput", "perf/time_per_step", "perf/weight_sync_gbps",
                     "perf/max_memory_", "perf/cpu_memory_", "perf/critic/max_memory_", "perf/critic/cpu_memory_")


def run_case(case: str, extra: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as out:
        cmd = ["tandem", "run", *CASES[case],
               f"trainer.total_training_steps={STEPS}", f"trainer.default_local_dir={out}", *extra]
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            sys.exit(f"{case}: run failed: {' '.join(cmd)}")
        (path,) = glob.glob(os.path.join(out, "*", "metrics.jsonl"))
        with open(path) as f:
            rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE_PREFIXES)} for r in rows]


def compare(golden: list[dict], got: list[dict]) -> list[str]:
    problems = []
    if len(golden) != len(got):
        problems.append(f"{len(golden)} metric rows in the golden file, {len(got)} now")
    for g, n in zip(golden, got):
        step = g.get("step")
        for k in sorted(set(g) | set(n)):
            if g.get(k) != n.get(k):
                problems.append(f"step {step}: {k}: golden {g.get(k)!r}, now {n.get(k)!r}")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["write", "check"])
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("overrides", nargs="*", help="extra dotted overrides for both modes")
    ns = p.parse_args()
    path = os.path.join(HERE, f"metrics_{ns.case}.json")
    got = run_case(ns.case, ns.overrides)
    if ns.mode == "write":
        with open(path, "w") as f:
            json.dump(got, f, indent=1)
        print(f"wrote {path}: {len(got)} rows")
        return 0
    with open(path) as f:
        golden = json.load(f)
    problems = compare(golden, got)
    for line in problems[:50]:
        print(line)
    print(f"{ns.case}: {len(got)} rows, {len(problems)} differences from {path}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
