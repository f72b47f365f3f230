"""Check that a reward service keeps the RewardService contract: `python -m tandem.reward.conformance HOST:PORT`
(also `tandem conformance HOST:PORT`).

Rules, each reported PASS or FAIL with what was wrong:

- `health`: grpc.health.v1 answers SERVING (overall, "");
- `scores_per_row`: one finite score per row in row order (a batch and its reverse get reversed
  scores), with the optional columns present (data_source, prompt_text, extra_info as JSON) and
  without; a row listed in `failures` must name a real row;
- `invalid_argument`: a request without response_text, without ground_truth, or with columns of
  different lengths is INVALID_ARGUMENT naming the column, and the service still scores afterwards;
- `deadline`: a small batch is scored within a 5 s deadline; a large batch under a 20 ms deadline
  ends in time (DEADLINE_EXCEEDED, or OK if it was that fast), and the service still scores afterwards;
- `auth` (with --token-file / --token-env): no token and a wrong token are UNAUTHENTICATED, the
  token is accepted;
- `tls` (with --tls-ca or --tls): a plaintext call to the port fails.

Exit status 0 when every rule passes, 1 otherwise. The service under test is only called, never
changed. Deliberately not checked: the scores' values (the rule is the service's own).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time

import grpc

from tandem.rpc.conformance import (
    RuleResult,
    add_arguments,
    auth_rule,
    health_rule,
    report,
    run_and_report,
    tls_rule,
    unary,
)
from tandem.rpc.security import PLAINTEXT, EndpointSecurity
from tandem.v1 import data_pb2, reward_pb2

__all__ = ["RuleResult", "add_arguments", "check", "main", "main_from_args", "report"]


SCORE = "/tandem.v1.RewardService/Score"
ROWS = [("the answer is 168.", "168", "tandem/arithmetic", "123+45=", {"split": "test", "index": 0}),
        ("1680", "168", "tandem/arithmetic", "123+45=", {"index": 1}),
        ("#### 42", "42", "openai/gsm8k", "What is six times seven?", {}),
        ("", "7", "", "3+4=", {"note": "empty response"}),
        ("\\boxed{9}", "9", "lighteval/MATH", "3^2 = ?", {"level": 1})]


def request(rows=ROWS, optional: bool = True, drop: str | None = None, short: str | None = None) -> bytes:
    """A ScoreRequest: the rows' columns; `drop` leaves a column out, `short` gives it one value too few."""
    names = ["response_text", "ground_truth"] + (["data_source", "prompt_text", "extra_info"] if optional else [])
    batch = data_pb2.Batch()
    for j, name in enumerate(names):
        if name == drop:
            continue
        index = ["response_text", "ground_truth", "data_source", "prompt_text", "extra_info"].index(name)
        values = [json.dumps(r[index]) if name == "extra_info" else r[index] for r in rows]
        if name == short:
            values = values[:-1]
        batch.columns.add(name=name, values=values, json=name == "extra_info")
    return reward_pb2.ScoreRequest(batch=batch).SerializeToString()


class Checker:
    def __init__(self, endpoint: str, security: EndpointSecurity, timeout_s: float = 30.0):
        self.endpoint, self.security, self.timeout_s = endpoint, security, timeout_s

    async def call(self, payload: bytes, timeout_s: float | None = None, security: EndpointSecurity | None = None):
        """-> (status code, details, ScoreResponse or None)."""
        return await unary(self.endpoint, security or self.security, SCORE, payload, reward_pb2.ScoreResponse,
                           timeout_s if timeout_s is not None else self.timeout_s)

    async def scores(self, payload: bytes, problems: list[str], what: str, rows: int) -> list[float] | None:
        code, details, response = await self.call(payload)
        if code != grpc.StatusCode.OK:
            problems.append(f"{what}: the call failed with {code.name}: {details}")
            return None
        failed = {f.row for f in response.failures}
        if len(response.scores) != rows:
            problems.append(f"{what}: {len(response.scores)} scores for {rows} rows")
            return None
        bad_rows = sorted(r for r in failed if not 0 <= r < rows)
        if bad_rows:
            problems.append(f"{what}: failures name rows {bad_rows} of a {rows}-row batch")
        nonfinite = [i for i, s in enumerate(response.scores) if i not in failed and not math.isfinite(s)]
        if nonfinite:
            problems.append(f"{what}: non-finite scores at rows {nonfinite} that are not listed as failures")
        return [s if i not in failed else math.nan for i, s in enumerate(response.scores)]

    async def health(self) -> RuleResult:
        return await health_rule(self.endpoint, self.security, self.timeout_s)

    async def scores_per_row(self) -> RuleResult:
        result = RuleResult("scores_per_row")
        forward = await self.scores(request(), result.problems, "all columns", len(ROWS))
        backward = await self.scores(request(ROWS[::-1]), result.problems, "rows reversed", len(ROWS))
        await self.scores(request(optional=False), result.problems, "required columns only", len(ROWS))
        if forward is not None and backward is not None:
            same = all((a == b) or (math.isnan(a) and math.isnan(b)) for a, b in zip(forward, backward[::-1]))
            if not same:
                result.problems.append(f"scores are not in row order: {forward} for the rows, "
                                       f"{backward} for the same rows reversed")
        return result

    async def invalid_argument(self) -> RuleResult:
        result = RuleResult("invalid_argument")
        cases = [("without response_text", request(drop="response_text"), "response_text"),
                 ("without ground_truth", request(drop="ground_truth"), "ground_truth"),
                 ("ground_truth one value short", request(short="ground_truth"), "ground_truth")]
        for what, payload, column in cases:
            code, details, _ = await self.call(payload)
            if code != grpc.StatusCode.INVALID_ARGUMENT:
                result.problems.append(f"a request {what} was answered {code.name}, not INVALID_ARGUMENT")
            elif column not in details:
                result.problems.append(f"a request {what}: the INVALID_ARGUMENT message does not name "
                                       f"'{column}': {details!r}")
        await self.scores(request(), result.problems, "a good request after the bad ones", len(ROWS))
        return result

    async def deadline(self) -> RuleResult:
        result = RuleResult("deadline")
        code, details, _ = await self.call(request(), timeout_s=5.0)
        if code != grpc.StatusCode.OK:
            result.problems.append(f"a {len(ROWS)}-row batch was not scored within a 5 s deadline: {code.name} {details}")
        big = request(ROWS * 4000)  # 20,000 rows under a 20 ms deadline: usually cancelled mid-call
        t0 = time.monotonic()
        code, details, _ = await self.call(big, timeout_s=0.02)
        if code not in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED):
            result.problems.append(f"a call with a 20 ms deadline ended {code.name}: {details}")
        if time.monotonic() - t0 > 2.0:
            result.problems.append(f"a call with a 20 ms deadline took {time.monotonic() - t0:.1f} s")
        await self.scores(request(), result.problems, "a call after a missed deadline", len(ROWS))
        return result

    async def auth(self) -> RuleResult:
        return await auth_rule(self.security, lambda security: self.call(request(), security=security),
                               lambda problems: self.scores(request(), problems, "a call with the token", len(ROWS)))

    async def tls(self) -> RuleResult:
        return await tls_rule(self.security, lambda security: self.call(request(), timeout_s=5.0, security=security))

    async def run(self) -> list[RuleResult]:
        rules = [self.health, self.scores_per_row, self.invalid_argument, self.deadline]
        if self.security.token:
            rules.append(self.auth)
        if self.security.tls is not None:
            rules.append(self.tls)
        return [await rule() for rule in rules]


def check(endpoint: str, security: EndpointSecurity = PLAINTEXT, timeout_s: float = 30.0) -> list[RuleResult]:
    """Every rule against the service at `endpoint` -> the results, in rule order."""
    return asyncio.run(Checker(endpoint, security, timeout_s).run())


def main_from_args(a: argparse.Namespace) -> int:
    return run_and_report(a, lambda endpoint, security: check(endpoint, security, a.timeout_s))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.reward.conformance",
                                description="check a reward service against the RewardService contract")
    add_arguments(p)
    return main_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
