"""An example EXTERNAL reward service: what a third party writes to plug a reward into Tandem.

It uses nothing of Tandem but the generated stubs (tandem.v1.reward_pb2, reward_pb2_grpc,
data_pb2), plus grpcio and grpcio-health-checking: the same service could be written in any
language from protos/tandem/v1/{reward,data}.proto. Its rule differs from the built-in one
on purpose: a row scores 1.0 when the response contains the ground truth as a whole-number
token ("the answer is 168." matches "168"; "1680" and "16.8" do not), else 0.0.

    python -m tandem.services.reward.examples.external_server --port 0 --port-file F
    tandem run services.reward.endpoint=127.0.0.1:PORT   # the controller attaches to it

Locked: --token-file F / --token-env VAR requires `authorization: Bearer <token>` on every call
(compared in constant time; health checks too unless --health-without-token); --tls-cert and
--tls-key serve TLS (--tls-ca with --require-client-cert: mutual TLS). Binds 127.0.0.1 unless
--host says otherwise.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import os
import re
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tandem.v1 import data_pb2, reward_pb2, reward_pb2_grpc

SERVICE = "tandem.v1.RewardService"
REQUIRED = ("response_text", "ground_truth")
_INT = re.compile(r"(?<![\d.])-?\d+(?![\d.]*\d)")  # an integer, not part of a longer number or a decimal


class BadRequest(ValueError):
    """A malformed request; answered with INVALID_ARGUMENT."""


def column_values(col: data_pb2.Column) -> list[str]:
    """A column's values as strings; json=true values are JSON-decoded first (168 -> "168")."""
    if not col.json:
        return list(col.values)
    out = []
    for i, text in enumerate(col.values):
        try:
            v = json.loads(text)
        except ValueError as e:
            raise BadRequest(f"column '{col.name}': row {i} is not valid JSON: {e}") from None
        out.append(v if isinstance(v, str) else json.dumps(v))
    return out


def read_columns(batch: data_pb2.Batch) -> dict[str, list[str]]:
    cols = {c.name: c for c in batch.columns}
    for name in REQUIRED:
        if name not in cols:
            raise BadRequest(f"missing required column '{name}' (columns present: {sorted(cols)})")
    rows = len(cols["response_text"].values)
    for c in batch.columns:
        if len(c.values) != rows:
            raise BadRequest(f"column '{c.name}' has {len(c.values)} values; "
                             f"column 'response_text' has {rows} rows")
    for t in batch.tensors:
        if not t.shape or t.shape[0] != rows:
            raise BadRequest(f"tensor '{t.name}' has shape {list(t.shape)}; expected {rows} rows")
    return {name: column_values(cols[name]) for name in REQUIRED}


def contains_whole_number(response: str, truth: str) -> float:
    try:
        want = int(truth.strip())
    except ValueError:
        return 0.0  # not a whole number: this rule does not apply
    return 1.0 if any(int(tok) == want for tok in _INT.findall(response)) else 0.0


class Reward(reward_pb2_grpc.RewardServiceServicer):
    async def Score(self, request, context):
        try:
            cols = read_columns(request.batch)
        except BadRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        scores = [contains_whole_number(r, g) for r, g in zip(cols["response_text"], cols["ground_truth"])]
        return reward_pb2.ScoreResponse(scores=scores)


class TokenAuth(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED unless the call carries `authorization: Bearer <token>` (health optionally open)."""

    def __init__(self, token: str, health_open: bool):
        self.expected, self.health_open = f"Bearer {token}".encode(), health_open

    async def intercept_service(self, continuation, details):
        sent = [v for k, v in details.invocation_metadata or () if k == "authorization"]
        ok = len(sent) == 1 and hmac.compare_digest(str(sent[0]).encode(), self.expected)
        if ok or (self.health_open and details.method.startswith("/grpc.health.v1.Health/")):
            return await continuation(details)

        async def deny(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token" if sent else "missing bearer token")
        return grpc.unary_unary_rpc_method_handler(deny)


def read_token(a) -> str | None:
    token = None
    if a.token_file:
        with open(a.token_file) as f:
            token = f.read().strip()
    elif a.token_env:
        token = os.environ.get(a.token_env, "").strip()
    if (a.token_file or a.token_env) and not token:
        raise SystemExit("external reward: the token is empty")
    return token


def bind(server, a) -> int:
    address = f"{a.host}:{a.port}"
    if not a.tls_cert:
        return server.add_insecure_port(address)
    def read(path):
        with open(path, "rb") as f:
            return f.read()
    creds = grpc.ssl_server_credentials([(read(a.tls_key), read(a.tls_cert))],
                                        root_certificates=read(a.tls_ca) if a.tls_ca else None,
                                        require_client_auth=a.require_client_cert)
    return server.add_secure_port(address, creds)


async def serve(a) -> None:
    token = read_token(a)
    server = grpc.aio.server(interceptors=[TokenAuth(token, a.health_without_token)] if token else [])
    reward_pb2_grpc.add_RewardServiceServicer_to_server(Reward(), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    host, port_file = a.host, a.port_file
    bound = bind(server, a)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if port_file:  # atomically, once SERVING
        with open(port_file + ".tmp", "w") as f:
            f.write(f"{bound}\n")
        os.replace(port_file + ".tmp", port_file)
    print(f"external reward: serving on {host}:{bound}", flush=True)
    await stop.wait()
    await health_servicer.enter_graceful_shutdown()
    await server.stop(2.0)
    if port_file and os.path.exists(port_file):
        os.remove(port_file)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="example external Tandem reward service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (see --port-file)")
    p.add_argument("--port-file", help="write the bound port here once serving")
    p.add_argument("--token-file", help="require this bearer token (a file holding it)")
    p.add_argument("--token-env", help="require this bearer token (an environment variable holding it)")
    p.add_argument("--health-without-token", action="store_true", help="answer health checks without a token")
    p.add_argument("--tls-cert", help="serve TLS with this certificate chain (PEM)")
    p.add_argument("--tls-key", help="... and this private key (PEM)")
    p.add_argument("--tls-ca", help="CA of client certificates (with --require-client-cert)")
    p.add_argument("--require-client-cert", action="store_true", help="mutual TLS")
    a = p.parse_args(argv)
    if bool(a.tls_cert) != bool(a.tls_key) or (a.require_client_cert and not a.tls_ca):
        p.error("--tls-cert and --tls-key go together; --require-client-cert needs --tls-ca")
    asyncio.run(serve(a))


if __name__ == "__main__":
    main()
