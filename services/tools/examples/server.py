"""The example tool server: the calculator tools (calculator.py) and verl's gsm8k answer checker
(gsm8k.py, which reads the row's kwargs: CallToolRequest.instance_kwargs_json) as a ToolService, and
the guess-the-number environment (guess_number.py) as an EnvironmentService, on one port. Kwargs that
are not a JSON object are INVALID_ARGUMENT naming the field, whichever tool is called.

    python -m tandem.services.tools.examples.server --port 0 --port-file F
    tandem conformance --contract tools 127.0.0.1:PORT

Served by tandem.rpc.server like Tandem's own services: grpc.health.v1, reflection, errors as
statuses naming the field, a graceful stop on SIGTERM, their JSON log lines on stderr (an `rpc` line
per call, with its method and status code). Locked like them: --token-file / --token-env
require `authorization: Bearer <token>` (health too unless --health-without-token); --tls-cert and
--tls-key serve TLS (--tls-ca with --require-client-cert: mutual). Binds 127.0.0.1 unless --host
says otherwise; beyond loopback only with a token or --insecure. The Node.js twin: node/server.js.
"""
from __future__ import annotations

import argparse
import json

from tandem.logging import configure_logging
from tandem.rpc.auth import read_token
from tandem.rpc.errors import InvalidArgument, NotFound
from tandem.rpc.exposure import exposure_problem
from tandem.rpc.security import EndpointSecurity
from tandem.rpc.server import run_server, serve
from tandem.rpc.tls import TLSFiles
from tandem.services.tools.examples import calculator, gsm8k
from tandem.services.tools.examples.guess_number import GuessNumber
from tandem.v1 import tools_pb2

TOOL_SERVICE, ENV_SERVICE = "tandem.v1.ToolService", "tandem.v1.EnvironmentService"


def _calculator(name: str, arguments_json: str, kwargs: dict) -> str:
    return calculator.call_tool(name, arguments_json)  # exact arithmetic needs nothing of the row


HANDLERS = {**{t["function"]["name"]: _calculator for t in calculator.TOOLS},
            **{t["function"]["name"]: gsm8k.call_tool for t in gsm8k.TOOLS}}


def instance_kwargs(text: str) -> dict:
    """The row's kwargs for the tool ({} when the caller sent none); BadArguments naming the field."""
    return calculator.json_object(text, "instance_kwargs_json") if text else {}


class ToolsServicer:
    async def ListTools(self, request, context):
        return tools_pb2.ListToolsResponse(tools=[tools_pb2.ToolSchema(json=json.dumps(t))
                                                  for t in calculator.TOOLS + gsm8k.TOOLS])

    async def CallTool(self, request, context):
        handler = HANDLERS.get(request.name)
        if handler is None:
            raise NotFound(f"no tool named {request.name!r} (tools: {', '.join(HANDLERS)})")
        try:
            kwargs = instance_kwargs(request.instance_kwargs_json)
            return tools_pb2.CallToolResponse(text=handler(request.name, request.arguments_json, kwargs))
        except calculator.BadArguments as e:
            raise InvalidArgument(str(e)) from None
        except calculator.ToolFailed as e:
            return tools_pb2.CallToolResponse(text=f"{request.name}: {e}", is_error=True)


class GuessNumberServicer:
    def __init__(self):
        self.env = GuessNumber()

    async def StartEpisode(self, request, context):
        return tools_pb2.StartEpisodeResponse(observation=self.env.start(request.instance_id, request.task_json))

    async def Step(self, request, context):
        observation, reward, done = self.env.step(request.instance_id, request.action)
        return tools_pb2.StepResponse(observation=observation, reward=reward, done=done)

    async def CloseEpisode(self, request, context):
        self.env.close(request.instance_id)
        return tools_pb2.CloseEpisodeResponse()


def security_from_args(a: argparse.Namespace) -> EndpointSecurity:
    tls = None
    if a.tls_cert:
        tls = TLSFiles(cert_file=a.tls_cert, key_file=a.tls_key, ca_file=a.tls_ca, client_auth=a.require_client_cert,
                       key_prefix="--tls")
    token = read_token(a.token_file, a.token_env, "", names=("--token-file", "--token-env"))
    return EndpointSecurity(tls, token, a.health_without_token)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m tandem.services.tools.examples.server",
                                description="example tool server: calculator tools, a gsm8k answer checker and a "
                                            "guess-the-number environment")
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
    p.add_argument("--insecure", action="store_true", help="allow a host beyond loopback without a token")
    a = p.parse_args(argv)
    if bool(a.tls_cert) != bool(a.tls_key) or (a.require_client_cert and not a.tls_ca):
        p.error("--tls-cert and --tls-key go together; --require-client-cert needs --tls-ca")
    try:
        security = security_from_args(a)
    except ValueError as e:
        p.error(str(e))
    problem = exposure_problem(a.host, security.token is not None, a.insecure)
    if problem:
        p.error(f"--host {a.host}: {problem}; set --token-file, or --insecure")
    servicers = [(TOOL_SERVICE, ToolsServicer()), (ENV_SERVICE, GuessNumberServicer())]
    configure_logging(role="tools")
    run_server(serve(servicers, role="tools", host=a.host, port=a.port, port_file=a.port_file, security=security))


if __name__ == "__main__":
    main()
