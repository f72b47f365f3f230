"""A Python tool server that fails on purpose, for the tool caller's and the conformance kit's tests.

    python faulty_tool_server.py --port-file F [--break RULE,...] [--token-file T]

Tools (ToolService only, no environment):
  echo {"text"}   answers the text
  wait {"key"}    blocks until `release` of the same key (or until cancelled), then answers "waited"
  release {"key"} waits until `wait` of that key has arrived, lets it answer, and answers "released"
  fail {}         INTERNAL "tool exploded"
  oops {}         is_error: "oops: division by zero"
  flaky {"key"}   UNAVAILABLE for the first 2 calls of each key, then "ok after 3 attempts"
  empty {}        answers an empty text (breaks the contract)
  kwargs {}       answers the call's instance_kwargs_json as it came ("(none)" when empty)

--break (each breaks one rule of tandem.tools.conformance; the tools are then echo and blank):
  health             no grpc.health.v1 service
  list_tools         lists echo twice, and a tool whose parameters are of type "array"
  call_tools         blank answers an empty text
  unknown_tool       an unlisted name is answered OK
  invalid_arguments  arguments that are not a JSON object are answered OK
  instance_kwargs    a call carrying kwargs (instance_kwargs_json) is INVALID_ARGUMENT
  deadline           a call with a deadline under 10 s takes 6 s
  auth               --token-file is read but never checked
"""
import argparse
import asyncio
import collections
import json

import grpc
from plain_server import serve_until_stopped

from tandem.v1 import tools_pb2, tools_pb2_grpc


def schema(name: str, properties: dict | None = None, kind: str = "object") -> str:
    params = {"type": kind, "properties": properties or {}, "required": sorted(properties or {})}
    return json.dumps({"type": "function", "function": {"name": name, "description": name, "parameters": params}})


TEXT, KEY = {"text": {"type": "string"}}, {"key": {"type": "string"}}
FAULT_TOOLS = {"echo": TEXT, "wait": KEY, "release": KEY, "fail": {}, "oops": {}, "flaky": KEY, "empty": {},
               "kwargs": {}}


class Faulty(tools_pb2_grpc.ToolServiceServicer):
    def __init__(self, broken: set[str], token: str | None):
        self.broken, self.token = broken, token
        self.arrived: collections.defaultdict = collections.defaultdict(asyncio.Event)  # key -> `wait` is in
        self.go: collections.defaultdict = collections.defaultdict(asyncio.Event)  # key -> `release` is in
        self.attempts: collections.Counter = collections.Counter()

    def listed(self) -> list[str]:
        if not self.broken:
            return [schema(n, p) for n, p in FAULT_TOOLS.items()]
        tools = [schema("echo", TEXT), schema("blank")]
        if "list_tools" in self.broken:
            tools += [schema("echo", TEXT), schema("listy", kind="array")]
        return tools

    async def check_token(self, context) -> None:
        if self.token and "auth" not in self.broken:
            if dict(context.invocation_metadata()).get("authorization") != f"Bearer {self.token}":
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")

    async def ListTools(self, request, context):
        await self.check_token(context)
        return tools_pb2.ListToolsResponse(tools=[tools_pb2.ToolSchema(json=j) for j in self.listed()])

    async def CallTool(self, request, context):
        await self.check_token(context)
        names = {json.loads(j)["function"]["name"] for j in self.listed()}
        if request.name not in names and "unknown_tool" not in self.broken:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no tool named {request.name!r}")
        try:
            args = json.loads(request.arguments_json)
            assert isinstance(args, dict), "not an object"
        except (ValueError, AssertionError) as e:
            if "invalid_arguments" not in self.broken:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"arguments: {e}")
            args = {}
        if request.name == "echo" and "text" not in args and "invalid_arguments" not in self.broken:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "missing required property 'text'")
        if "instance_kwargs" in self.broken and request.instance_kwargs_json:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "instance_kwargs_json: not expected")
        if "deadline" in self.broken and (context.time_remaining() or 60) < 10:
            await asyncio.sleep(6)
        return await self.run(request.name, args, context, request.instance_kwargs_json)

    async def run(self, name: str, args: dict, context, kwargs_json: str = ""):
        text, is_error = "", False
        if name == "echo":
            text = str(args.get("text", "echo"))
        elif name == "blank":
            text = "" if "call_tools" in self.broken else "blank"
        elif name == "wait":
            self.arrived[args.get("key")].set()
            await self.go[args.get("key")].wait()
            text = "waited"
        elif name == "release":  # in whichever order the two calls reach the server
            await self.arrived[args.get("key")].wait()
            self.go[args.get("key")].set()
            text = "released"
        elif name == "fail":
            await context.abort(grpc.StatusCode.INTERNAL, "tool exploded")
        elif name == "kwargs":
            text = kwargs_json or "(none)"
        elif name == "oops":
            text, is_error = "oops: division by zero", True
        elif name == "flaky":
            self.attempts[args.get("key")] += 1
            if self.attempts[args.get("key")] <= 2:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
            text = f"ok after {self.attempts[args.get('key')]} attempts"
        return tools_pb2.CallToolResponse(text=text, is_error=is_error)


async def serve(a) -> None:
    token = open(a.token_file).read().strip() if a.token_file else None
    server = grpc.aio.server()
    tools_pb2_grpc.add_ToolServiceServicer_to_server(Faulty(set(a.broken), token), server)
    await serve_until_stopped(server, a.port_file, with_health="health" not in a.broken)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port-file", required=True)
    p.add_argument("--break", dest="broken", default="", type=lambda s: [x for x in s.split(",") if x])
    p.add_argument("--token-file")
    asyncio.run(serve(p.parse_args()))
