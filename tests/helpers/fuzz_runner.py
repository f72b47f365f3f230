"""Sends hypothesis-generated cases (fuzz_strategies.py) to running services (fuzz_targets.py)
and records what came back: statuses per RPC, unexpected ones, services that died.

`FuzzRun.run(n)` drives hypothesis for about `n` requests, an equal share for each RPC (a case for
RolloutService goes to the colocated and the standalone rollout), checking every `check_every`
requests that each service process is alive and SERVING. The test asserts on the record; the bench
prints it.
"""
from __future__ import annotations

import warnings
from collections import Counter, defaultdict

from fuzz_strategies import Case, cases, rpcs
from fuzz_targets import Targets, allowed, roles_for
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import HypothesisWarning

# the strategies hold whole valid requests (weights included): their repr is megabytes
warnings.filterwarnings("ignore", category=HypothesisWarning, message="Generating overly large repr")


class FuzzRun:
    def __init__(self, targets: Targets, seed: int = 0, check_every: int = 250):
        self.targets, self.seed, self.check_every = targets, seed, check_every
        self.seeds = targets.seeds()
        self.paths = targets.paths()
        self.sent = 0
        self.by_rpc: dict[str, Counter] = defaultdict(Counter)
        self.unexpected: list[tuple[str, str, Case, str]] = []  # (code, role, case, details)
        self.crashed: set[str] = set()
        self.crashed_by: Case | None = None
        self.cases: list[Case] = []

    def run(self, requests: int) -> None:
        self.check()  # the valid seeds answered: every service is up before the first case
        names = [r.name for r in rpcs()]
        for name in names:  # one share each: every RPC is fuzzed whatever hypothesis's draws
            self._run(cases(self.seeds, self.paths, self.targets.vocab, only=name), -(-requests // len(names)))
        self.check()

    def _run(self, strategy, examples: int) -> None:
        @seed(self.seed)
        @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def one(case: Case) -> None:
            if not self.crashed:
                self.send(case)

        one()

    def send(self, case: Case) -> None:
        self.cases.append(case)
        for role in roles_for(case.rpc, self.targets):
            code, details = self.targets.send(case, role)
            self.sent += 1
            self.by_rpc[case.rpc.name][code] += 1
            if not allowed(code, case.rpc):
                self.unexpected.append((code, role, case, details))
            if self.sent % self.check_every == 0 or code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                self.check()
                if self.crashed and self.crashed_by is None:
                    self.crashed_by = case  # (or one sent before it, since the last check)

    def check(self) -> None:
        """Every service process alive and SERVING; the dead ones are recorded."""
        alive, healthy = self.targets.alive(), self.targets.healthy()
        self.crashed |= {role for role in alive if not (alive[role] and healthy.get(role, False))}
