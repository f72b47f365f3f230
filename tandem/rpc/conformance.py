"""What every conformance kit shares (tandem/reward/conformance.py, tandem/tools/conformance.py):
rule results and their report, the command line's endpoint and security flags, one unary call
that answers (code, details, response) instead of raising, and the rules every contract has
(health, auth, tls).

Deliberately not here: any contract's own rules; this module knows no service.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.rpc.auth import read_token
from tandem.rpc.client import make_channel
from tandem.rpc.security import EndpointSecurity
from tandem.rpc.tls import TLSFiles


@dataclass
class RuleResult:
    rule: str
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


async def unary(endpoint: str, security: EndpointSecurity, method: str, payload: bytes, response_cls,
                timeout_s: float):
    """One call of `method` ("/pkg.Service/Method") with serialized `payload` -> (status code, details,
    response or None); a fresh channel, so one call's state never leaks into the next."""
    async with make_channel(endpoint, security=security) as channel:
        fn = channel.unary_unary(method, request_serializer=None, response_deserializer=response_cls.FromString)
        try:
            return grpc.StatusCode.OK, "", await fn(payload, timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or "", None


async def health_rule(endpoint: str, security: EndpointSecurity, timeout_s: float) -> RuleResult:
    """`health`: grpc.health.v1 answers SERVING for the server as a whole ("")."""
    result = RuleResult("health")
    async with make_channel(endpoint, security=security) as channel:
        try:
            r = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                                timeout=timeout_s)
            if r.status != health_pb2.HealthCheckResponse.SERVING:
                result.problems.append(f"grpc.health.v1 Check('') answered "
                                       f"{health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)}, not SERVING")
        except grpc.aio.AioRpcError as e:
            result.problems.append(f"grpc.health.v1 Check('') failed with {e.code().name}: {e.details()}")
    return result


async def auth_rule(security: EndpointSecurity, call: Callable[[EndpointSecurity], Awaitable[tuple]],
                    still_works: Callable[[list[str]], Awaitable[object]]) -> RuleResult:
    """`auth`: `call` with no token and with a wrong one is UNAUTHENTICATED; `still_works` (with the
    token) adds a problem if the real call then fails."""
    result = RuleResult("auth")
    for what, token in (("no token", None), ("a wrong token", security.token + "-wrong")):
        code, _, _ = await call(EndpointSecurity(security.tls, token))
        if code != grpc.StatusCode.UNAUTHENTICATED:
            result.problems.append(f"a call with {what} was answered {code.name}, not UNAUTHENTICATED")
    await still_works(result.problems)
    return result


async def tls_rule(security: EndpointSecurity, call: Callable[[EndpointSecurity], Awaitable[tuple]]) -> RuleResult:
    """`tls`: a plaintext call to the TLS port is not answered."""
    result = RuleResult("tls")
    code, _, _ = await call(EndpointSecurity(None, security.token))
    if code == grpc.StatusCode.OK:
        result.problems.append("a plaintext call to the TLS port was answered")
    return result


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


def security_from_args(a: argparse.Namespace) -> EndpointSecurity:
    """The flags of `add_arguments` -> the endpoint's security; ValueError naming a bad token source."""
    token = read_token(a.token_file, a.token_env, "conformance")
    tls = None
    if a.tls or a.tls_ca or a.tls_client_cert:
        tls = TLSFiles(ca_file=a.tls_ca, client_auth=bool(a.tls_client_cert), client_cert_file=a.tls_client_cert,
                       client_key_file=a.tls_client_key, server_name=a.tls_server_name, key_prefix="--tls")
    return EndpointSecurity(tls, token)


def run_and_report(a: argparse.Namespace, check: Callable[[str, EndpointSecurity], list[RuleResult]]) -> int:
    """Check the endpoint the flags name, print the report -> exit status (0 all passed, 1 not, 2 bad flags)."""
    try:
        security = security_from_args(a)
    except ValueError as e:
        print(f"conformance: {e}", file=sys.stderr)
        return 2
    results = check(a.endpoint, security)
    print(report(results))
    return 0 if all(r.passed for r in results) else 1
