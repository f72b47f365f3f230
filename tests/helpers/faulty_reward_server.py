"""A Python reward server that breaks on purpose, for the conformance and reward-fault tests.

    python faulty_reward_server.py --port-file F [--break RULE,...] [--fault MODE] [--token-file T]

--break (conformance: each breaks one rule of tandem.reward.conformance):
  health            no grpc.health.v1 service at all
  rows              one score fewer than rows
  invalid_argument  malformed requests are scored anyway (OK instead of INVALID_ARGUMENT)
  deadline          a call with a deadline under 10 s takes 6 s
  auth              --token-file is read but never checked

--fault (reward faults; every scored row gets 1.0, so a silent 0 would show in the mean):
  timeout           every call sleeps 30 s (past any deadline the tests set)
  error             every call fails INTERNAL
  crash             the process exits on its first Score call
  flaky             the first 2 calls are UNAVAILABLE, then it scores
  rows              rows whose response_text is empty or starts with "1" are listed as failures
"""
import argparse
import asyncio
import os
import sys

import grpc
from plain_server import serve_until_stopped

from tandem.v1 import reward_pb2, reward_pb2_grpc


class Faulty(reward_pb2_grpc.RewardServiceServicer):
    def __init__(self, broken: set[str], fault: str | None, token: str | None):
        self.broken, self.fault, self.token, self.calls = broken, fault, token, 0

    async def Score(self, request, context):
        self.calls += 1
        if self.token and "auth" not in self.broken:
            sent = dict(context.invocation_metadata()).get("authorization")
            if sent != f"Bearer {self.token}":
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")
        cols = {c.name: list(c.values) for c in request.batch.columns}
        rows = len(cols.get("response_text", cols.get("ground_truth", [])))
        if "invalid_argument" not in self.broken:
            for name in ("response_text", "ground_truth"):
                if name not in cols:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"missing column '{name}'")
            if any(len(v) != rows for v in cols.values()):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "column 'ground_truth': wrong row count")
        if "deadline" in self.broken and (context.time_remaining() or 60) < 10:
            await asyncio.sleep(6)  # only under short deadlines, so the other rules' calls stay fast
        if self.fault == "timeout":
            await asyncio.sleep(30)
        if self.fault == "error":
            await context.abort(grpc.StatusCode.INTERNAL, "verifier exploded")
        if self.fault == "crash":
            os._exit(3)
        if self.fault == "flaky" and self.calls <= 2:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        failures = []
        if self.fault == "rows":
            failures = [reward_pb2.RowFailure(row=i, reason="sandbox timed out")
                        for i, text in enumerate(cols["response_text"]) if not text or text.startswith("1")]
        failed = {f.row for f in failures}
        scores = [float("nan") if i in failed else 1.0 for i in range(rows)]
        if "rows" in self.broken:
            scores = scores[:-1]
        return reward_pb2.ScoreResponse(scores=scores, failures=failures)


async def serve(a) -> None:
    token = open(a.token_file).read().strip() if a.token_file else None
    server = grpc.aio.server()
    reward_pb2_grpc.add_RewardServiceServicer_to_server(Faulty(set(a.broken), a.fault, token), server)
    await serve_until_stopped(server, a.port_file, with_health="health" not in a.broken)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port-file", required=True)
    p.add_argument("--break", dest="broken", default="", type=lambda s: [x for x in s.split(",") if x])
    p.add_argument("--fault", choices=["timeout", "error", "crash", "flaky", "rows"])
    p.add_argument("--token-file")
    asyncio.run(serve(p.parse_args()))
    sys.exit(0)
