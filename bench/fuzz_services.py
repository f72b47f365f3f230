"""Fuzz every RPC of every Tandem service with malformed and adversarial requests (hypothesis).

Starts the four services as `tandem run` does (a two-rank actor serving ActorService and its
colocated RolloutService, a standalone rollout, a critic, the reward service), makes a valid
request of every RPC from their own answers, and sends `--requests` generated requests
(tests/helpers/fuzz_strategies.py: any message from the descriptor, valid requests with one
to three mutations, corrupted bytes). A good answer is OK or a clear status
(INVALID_ARGUMENT, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, NOT_FOUND for a checkpoint path,
ABORTED for a weight-plane version an update replaced); RolloutService.SyncWeights and
ActorService.JoinWeightGroup are not fuzzed (they dial addresses named in the request);
anything else is counted as unexpected and printed with what made the request. Prints the
count per RPC and status, unexpected statuses, crashed services, and each service's resident
memory before and after (all its ranks) with the growth as a ratio of the baseline.

    python bench/fuzz_services.py                 # 10,000 requests (tests/services/test_fuzz.py: a few hundred)
    python bench/fuzz_services.py --requests 500 --seed 3
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "helpers")]  # run from anywhere; the fuzzer's helpers


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-every", type=int, default=250, help="health and liveness check period (requests)")
    p.add_argument("--timeout", type=float, default=60, help="seconds a request may take (a longer one is a hang)")
    args = p.parse_args()

    from fuzz_targets import Targets
    from service_procs import start_services, stop_services
    from transformers import AutoTokenizer

    from tandem.models.shape_from_config import padded_vocab_size

    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"python {platform.python_version()}", flush=True)
    tmp = tempfile.mkdtemp(prefix="tandem-fuzz-")
    started = start_services(tmp, "fuzz", ["services.actor.world_size=2"])  # every rank must stay intact
    try:
        tok = AutoTokenizer.from_pretrained(started.cfg.actor_rollout_ref.model.tokenizer_path)
        targets = Targets(started.endpoints, started.pids, tok, padded_vocab_size(len(tok)),
                          os.path.join(tmp, "fuzz"), timeout_s=args.timeout)
        os.makedirs(targets.workdir)
        rc = fuzz(targets, args)
    finally:
        stop_services(started.launchers)
    if rc == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"services' logs kept in {started.run_dir}/logs")
    return rc


def fuzz(targets, args) -> int:
    from fuzz_runner import FuzzRun

    run = FuzzRun(targets, seed=args.seed, check_every=args.check_every)
    base = targets.rss_mib()
    t0 = time.perf_counter()
    run.run(args.requests)
    seconds = time.perf_counter() - t0
    after = targets.rss_mib()

    print(f"\n{run.sent} requests over {len(run.by_rpc)} RPCs in {seconds:.0f} s "
          f"({run.sent / seconds:.0f} requests/s)")
    for rpc, codes in sorted(run.by_rpc.items()):
        print(f"  {rpc:34s} " + ", ".join(f"{c} {n}" for c, n in sorted(codes.items())))
    print(f"unexpected statuses: {len(run.unexpected)}")
    for code, role, case, details in run.unexpected[:20]:
        print(f"  {code} from {role} on {case.rpc.name} ({case.how}): {details[:300]}")
    print(f"crashed services: {len(run.crashed)} {sorted(run.crashed)}"
          + (f", after {run.crashed_by.rpc.name} ({run.crashed_by.how})" if run.crashed_by else ""))
    print("memory (resident, all ranks):")
    for role in sorted(base):
        grow = after[role] - base[role]
        print(f"  {role:8s} {base[role]:8.1f} MiB -> {after[role]:8.1f} MiB: growth {grow:+7.1f} MiB "
              f"({after[role] / base[role]:.3f}x the baseline)")
    kinds = Counter(case.how.split(":")[0].split(" ")[0] for case in run.cases)
    print("generators: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    return 1 if run.unexpected or run.crashed else 0


if __name__ == "__main__":
    sys.exit(main())
