"""`python -m tandem.rpc.healthcheck HOST:PORT [--service NAME] [--timeout S]`: one grpc.health.v1 check.

Exit 0 when the server answers SERVING, 1 otherwise (not serving, unreachable, timed out), with
one line on stderr saying which. Container health checks call it (deploy/compose.yaml); so can
an operator. Deliberately not here: waiting or retrying (the caller's interval and retries do).
"""
from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(target: str, service: str = "", timeout_s: float = 3.0) -> tuple[bool, str]:
    """(serving?, what was seen) for one Check of `service` ("" = the whole server) at `target`."""
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as e:
            return False, f"{target}: {e.code().name}: {e.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{target}: {status}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.rpc.healthcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("target", metavar="HOST:PORT")
    p.add_argument("--service", default="", help="a gRPC service name (default: the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    a = p.parse_args(argv)
    ok, seen = check(a.target, a.service, a.timeout)
    print(seen, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
