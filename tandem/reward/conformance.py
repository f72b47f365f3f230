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
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.rpc.auth import read_token
from tandem.rpc.client import make_channel
from tandem.rpc.security import PLAINTEXT, EndpointSecurity
from tandem.rpc.tls import TLSFiles
from tandem.v1 import data_pb2, reward_pb2

SCORE = "/tandem.v1.RewardService/Score"
ROWS = [("the answer is 168.", "168", "tandem/arithmetic", "123+45=", {"split": "test", "index": 0}),
        ("1680", "168", "tandem/arithmetic", "123+45=", {"index": 1}),
        ("#### 42", "42", "openai/gsm8k", "What is six times seven?", {}),
        ("", "7", "", "3+4=", {"note": "empty response"}),
        ("\\boxed{9}", "9", "lighteval/MATH", "3^2 = ?", {"level": 1})]


@dataclass
class RuleResult:
    rule: str
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


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
        async with make_channel(self.endpoint, security=security or self.security) as channel:
            fn = channel.unary_unary(SCORE, request_serializer=None, response_deserializer=reward_pb2.ScoreResponse.FromString)
            try:
                return grpc.StatusCode.OK, "", await fn(payload, timeout=timeout_s if timeout_s is not None else self.timeout_s)
            except grpc.aio.AioRpcError as e:
                return e.code(), e.details() or "", None

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
        result = RuleResult("health")
        async with make_channel(self.endpoint, security=self.security) as channel:
            try:
                r = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                                    timeout=self.timeout_s)
                if r.status != health_pb2.HealthCheckResponse.SERVING:
                    result.problems.append(f"grpc.health.v1 Check('') answered "
                                           f"{health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)}, not SERVING")
            except grpc.aio.AioRpcError as e:
                result.problems.append(f"grpc.health.v1 Check('') failed with {e.code().name}: {e.details()}")
        return result

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
        result = RuleResult("auth")
        for what, token in (("no token", None), ("a wrong token", self.security.token + "-wrong")):
            code, details, _ = await self.call(request(), security=EndpointSecurity(self.security.tls, token))
            if code != grpc.StatusCode.UNAUTHENTICATED:
                result.problems.append(f"a call with {what} was answered {code.name}, not UNAUTHENTICATED")
        await self.scores(request(), result.problems, "a call with the token", len(ROWS))
        return result

    async def tls(self) -> RuleResult:
        result = RuleResult("tls")
        code, _, _ = await self.call(request(), timeout_s=5.0, security=EndpointSecurity(None, self.security.token))
        if code == grpc.StatusCode.OK:
            result.problems.append("a plaintext call to the TLS port was answered")
        return result

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


def report(results: list[RuleResult]) -> str:
    lines = []
    for r in results:
        lines.append(f"{'PASS' if r.passed else 'FAIL'} {r.rule}")
        lines += [f"     {r.rule}: {p}" for p in r.problems]
    failed = [r.rule for r in results if not r.passed]
    lines.append(f"{len(results) - len(failed)} passed, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("endpoint", metavar="HOST:PORT")
    p.add_argument("--token-file", help="a file holding the bearer token (checks the auth rule)")
    p.add_argument("--token-env", help="an environment variable holding the bearer token")
    p.add_argument("--tls", action="store_true", help="connect with TLS (system roots unless --tls-ca)")
    p.add_argument("--tls-ca", help="CA certificate to check the service with (implies --tls)")
    p.add_argument("--tls-client-cert", help="client certificate for mutual TLS")
    p.add_argument("--tls-client-key", help="client key for mutual TLS")
    p.add_argument("--tls-server-name", help="name to check the certificate against")
    p.add_argument("--timeout-s", type=float, default=30.0, help="deadline of each call (default 30)")


def main_from_args(a: argparse.Namespace) -> int:
    try:
        token = read_token(a.token_file, a.token_env, "conformance")
    except ValueError as e:
        print(f"conformance: {e}", file=sys.stderr)
        return 2
    tls = None
    if a.tls or a.tls_ca or a.tls_client_cert:
        tls = TLSFiles(ca_file=a.tls_ca, client_auth=bool(a.tls_client_cert), client_cert_file=a.tls_client_cert,
                       client_key_file=a.tls_client_key, server_name=a.tls_server_name, key_prefix="--tls")
    results = check(a.endpoint, EndpointSecurity(tls, token), a.timeout_s)
    print(report(results))
    return 0 if all(r.passed for r in results) else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.reward.conformance",
                                description="check a reward service against the RewardService contract")
    add_arguments(p)
    return main_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
