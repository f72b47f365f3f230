"""Check that a tool server keeps the ToolService contract (protos/tandem/v1/tools.proto), and the
EnvironmentService one when it serves it: `tandem conformance --contract tools HOST:PORT` (also
`python -m tandem.tools.conformance HOST:PORT`).

Rules, each reported PASS or FAIL with one line per problem:

- `health`: grpc.health.v1 answers SERVING (overall, "");
- `list_tools`: at least one tool; each is JSON of an OpenAI-style function ({"type": "function",
  "function": {"name", "description", "parameters"}}) with a name of 1-64 letters, digits, _ or -,
  unique; `parameters` a JSON Schema of type "object" (checked with jsonschema when installed);
- `call_tools`: every tool, called with arguments made from its schema (a property's `examples`,
  `default` or `enum` first, else a value of its type), answers OK with a non-empty text;
- `unknown_tool`: a tool name the server did not list is NOT_FOUND (or INVALID_ARGUMENT) with a
  message naming it;
- `invalid_arguments`: arguments that are not JSON, not a JSON object, or lack a required property
  are INVALID_ARGUMENT (the last naming the property), and the server answers afterwards;
- `instance_kwargs`: every tool, called as in `call_tools` but with a row's kwargs it does not use
  (`instance_kwargs_json`, verl's tools_kwargs entry), answers OK: rows carry kwargs for many tools;
- `deadline`: a call is answered within a 5 s deadline; a call under a 1 ms deadline ends (OK or
  DEADLINE_EXCEEDED) within 2 s, and the server answers afterwards;
- `auth` (with --token-file / --token-env): no token and a wrong token are UNAUTHENTICATED;
- `tls` (with --tls-ca or --tls): a plaintext call to the port fails;
- `episode`, `episode_errors` (only when EnvironmentService is served; the task is --env-task):
  StartEpisode, Step (a finite reward), CloseEpisode answer OK; Step after CloseEpisode, Step and
  CloseEpisode of an unknown id are NOT_FOUND; a task that is not JSON is INVALID_ARGUMENT; starting
  an open id again is ALREADY_EXISTS.

Exit status 0 when every rule passes, 1 otherwise. Deliberately not checked: what a tool answers
(its results are its own), and whether an environment's rewards are right.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
import uuid

import grpc

from tandem.rpc.conformance import (
    RuleResult,
    auth_rule,
    health_rule,
    report,
    run_and_report,
    tls_rule,
    unary,
)
from tandem.rpc.conformance import (
    add_arguments as add_common_arguments,
)
from tandem.rpc.security import PLAINTEXT, EndpointSecurity
from tandem.tools.schemas import example_arguments, schema_problems
from tandem.v1 import tools_pb2

__all__ = ["check", "main", "main_from_args", "report"]

LIST, CALL = "/tandem.v1.ToolService/ListTools", "/tandem.v1.ToolService/CallTool"
START, STEP, CLOSE = ("/tandem.v1.EnvironmentService/StartEpisode", "/tandem.v1.EnvironmentService/Step",
                      "/tandem.v1.EnvironmentService/CloseEpisode")
NO_SUCH_TOOL = "tandem_conformance_no_such_tool"
# kwargs in verl's shape that no tool uses: a tool must not fail for what it ignores
UNUSED_KWARGS = json.dumps({"create_kwargs": {"tandem_conformance_unused": "x"}, "execute_kwargs": {}})


def _call(name: str, arguments_json: str, instance_kwargs_json: str = "") -> bytes:
    call_id = f"conformance-{uuid.uuid4().hex[:8]}"
    return tools_pb2.CallToolRequest(name=name, arguments_json=arguments_json, call_id=call_id,
                                     instance_kwargs_json=instance_kwargs_json).SerializeToString()


class Checker:
    def __init__(self, endpoint: str, security: EndpointSecurity, timeout_s: float = 30.0, env_task: str = "{}"):
        self.endpoint, self.security, self.timeout_s, self.env_task = endpoint, security, timeout_s, env_task
        self.tools: dict[str, dict] = {}  # name -> its "function" object, the valid ones ListTools gave
        self.notes: list[str] = []

    async def rpc(self, method: str, payload: bytes, response_cls, timeout_s: float | None = None,
                  security: EndpointSecurity | None = None):
        return await unary(self.endpoint, security or self.security, method, payload, response_cls,
                           timeout_s if timeout_s is not None else self.timeout_s)

    async def call_tool(self, name: str, arguments_json: str, instance_kwargs_json: str = "", **kw):
        return await self.rpc(CALL, _call(name, arguments_json, instance_kwargs_json), tools_pb2.CallToolResponse,
                              **kw)

    async def answers(self, problems: list[str], what: str, **kw) -> None:
        """A good call (the first listed tool with its example arguments) answers OK with text."""
        if not self.tools:
            return
        name, fn = next(iter(self.tools.items()))
        code, details, r = await self.call_tool(name, json.dumps(example_arguments(fn["parameters"])), **kw)
        if code != grpc.StatusCode.OK:
            problems.append(f"{what}: {name} failed with {code.name}: {details}")
        elif not r.text:
            problems.append(f"{what}: {name} answered an empty text")

    async def health(self) -> RuleResult:
        return await health_rule(self.endpoint, self.security, self.timeout_s)

    async def list_tools(self) -> RuleResult:
        result = RuleResult("list_tools")
        code, details, r = await self.rpc(LIST, tools_pb2.ListToolsRequest().SerializeToString(),
                                          tools_pb2.ListToolsResponse)
        if code != grpc.StatusCode.OK:
            result.problems.append(f"ListTools failed with {code.name}: {details}")
            return result
        if not r.tools:
            result.problems.append("ListTools listed no tools")
        for i, tool in enumerate(r.tools):
            problems, fn = schema_problems(tool.json)
            result.problems += [f"tools[{i}]: {p}" for p in problems]
            if fn is None:
                continue
            if fn["name"] in self.tools:
                result.problems.append(f"tools[{i}]: the name {fn['name']!r} is listed twice")
            elif not problems:
                self.tools[fn["name"]] = fn
        return result

    async def call_tools(self, rule: str = "call_tools", kwargs: str = "") -> RuleResult:
        """Every tool with its example arguments (and `kwargs` as instance_kwargs_json) answers OK with text."""
        result = RuleResult(rule)
        if not self.tools:
            result.problems.append("no valid tool to call (see list_tools)")
        with_kwargs = " with kwargs it does not use" if kwargs else ""

        async def one(name: str, fn: dict) -> None:
            args = example_arguments(fn["parameters"])
            code, details, r = await self.call_tool(name, json.dumps(args), kwargs)
            if code != grpc.StatusCode.OK:
                result.problems.append(f"{name}({json.dumps(args)}){with_kwargs} failed with {code.name}: {details}")
            elif not r.text:
                result.problems.append(f"{name}({json.dumps(args)}){with_kwargs} answered an empty text")

        await asyncio.gather(*(one(n, fn) for n, fn in self.tools.items()))  # concurrently, as a rollout calls
        return result

    async def instance_kwargs(self) -> RuleResult:
        return await self.call_tools("instance_kwargs", UNUSED_KWARGS)

    async def unknown_tool(self) -> RuleResult:
        result = RuleResult("unknown_tool")
        code, details, _ = await self.call_tool(NO_SUCH_TOOL, "{}")
        if code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
            result.problems.append(f"a call of the unlisted tool {NO_SUCH_TOOL!r} was answered {code.name}, "
                                   f"not NOT_FOUND")
        elif NO_SUCH_TOOL not in details:
            result.problems.append(f"the {code.name} message for an unlisted tool does not name it: {details!r}")
        await self.answers(result.problems, "a good call after the unknown tool")
        return result

    async def invalid_arguments(self) -> RuleResult:
        result = RuleResult("invalid_arguments")
        if not self.tools:
            result.problems.append("no valid tool to call (see list_tools)")
            return result
        name, fn = next(iter(self.tools.items()))
        cases = [("arguments that are not JSON", "{not json", None), ("arguments that are a JSON list", "[1, 2]", None)]
        required = fn["parameters"].get("required") or []
        if required:
            args = example_arguments(fn["parameters"])
            del args[required[0]]
            cases.append((f"arguments without the required {required[0]!r}", json.dumps(args), required[0]))
        for what, arguments_json, named in cases:
            code, details, _ = await self.call_tool(name, arguments_json)
            if code != grpc.StatusCode.INVALID_ARGUMENT:
                result.problems.append(f"{name} with {what} was answered {code.name}, not INVALID_ARGUMENT")
            elif named and named not in details:
                result.problems.append(f"{name} with {what}: the message does not name {named!r}: {details!r}")
        await self.answers(result.problems, "a good call after the bad ones")
        return result

    async def deadline(self) -> RuleResult:
        result = RuleResult("deadline")
        await self.answers(result.problems, "a call under a 5 s deadline", timeout_s=5.0)
        if self.tools:
            name, fn = next(iter(self.tools.items()))
            t0 = time.monotonic()
            code, details, _ = await self.call_tool(name, json.dumps(example_arguments(fn["parameters"])),
                                                    timeout_s=0.001)
            if code not in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED):
                result.problems.append(f"a call with a 1 ms deadline ended {code.name}: {details}")
            if time.monotonic() - t0 > 2.0:
                result.problems.append(f"a call with a 1 ms deadline took {time.monotonic() - t0:.1f} s")
        await self.answers(result.problems, "a call after a missed deadline")
        return result

    async def auth(self) -> RuleResult:
        return await auth_rule(self.security, lambda security: self.rpc(
            LIST, tools_pb2.ListToolsRequest().SerializeToString(), tools_pb2.ListToolsResponse, security=security),
            lambda problems: self.answers(problems, "a call with the token"))

    async def tls(self) -> RuleResult:
        return await tls_rule(self.security, lambda security: self.rpc(
            LIST, tools_pb2.ListToolsRequest().SerializeToString(), tools_pb2.ListToolsResponse, timeout_s=5.0,
            security=security))

    # ---- EnvironmentService ------------------------------------------------------------------

    async def env(self, method: str, response_cls, **fields):
        request_cls = {START: tools_pb2.StartEpisodeRequest, STEP: tools_pb2.StepRequest,
                       CLOSE: tools_pb2.CloseEpisodeRequest}[method]
        return await self.rpc(method, request_cls(**fields).SerializeToString(), response_cls)

    async def serves_environments(self) -> bool:
        code, details, _ = await self.env(CLOSE, tools_pb2.CloseEpisodeResponse, instance_id=_instance())
        if code == grpc.StatusCode.UNIMPLEMENTED:
            self.notes.append(f"EnvironmentService is not served ({details or 'UNIMPLEMENTED'}): "
                              "its rules (episode, episode_errors) were not checked")
            return False
        return True

    def expect(self, problems: list[str], what: str, got: tuple, want: grpc.StatusCode):
        code, details, response = got
        if code != want:
            problems.append(f"{what} was answered {code.name}{': ' + details if details else ''}, not {want.name}")
        return response

    async def episode(self) -> RuleResult:
        result, ok, gone = RuleResult("episode"), grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND
        p, iid = result.problems, _instance()
        if self.expect(p, "StartEpisode", await self.env(START, tools_pb2.StartEpisodeResponse, instance_id=iid,
                                                         task_json=self.env_task), ok) is None:
            return result
        step = self.expect(p, "Step", await self.env(STEP, tools_pb2.StepResponse, instance_id=iid, action="1"), ok)
        if step is not None and not math.isfinite(step.reward):
            p.append(f"Step answered a non-finite reward {step.reward}")
        self.expect(p, "CloseEpisode", await self.env(CLOSE, tools_pb2.CloseEpisodeResponse, instance_id=iid), ok)
        self.expect(p, "Step after CloseEpisode", await self.env(STEP, tools_pb2.StepResponse, instance_id=iid,
                                                                 action="1"), gone)
        return result

    async def episode_errors(self) -> RuleResult:
        result, ok = RuleResult("episode_errors"), grpc.StatusCode.OK
        p, iid = result.problems, _instance()
        self.expect(p, "Step of an id never started", await self.env(STEP, tools_pb2.StepResponse,
                                                                     instance_id=_instance(), action="1"),
                    grpc.StatusCode.NOT_FOUND)
        self.expect(p, "StartEpisode with a task that is not JSON", await self.env(
            START, tools_pb2.StartEpisodeResponse, instance_id=_instance(), task_json="{not json"),
            grpc.StatusCode.INVALID_ARGUMENT)
        if self.expect(p, "StartEpisode", await self.env(START, tools_pb2.StartEpisodeResponse, instance_id=iid,
                                                         task_json=self.env_task), ok) is not None:
            self.expect(p, "StartEpisode of an open id", await self.env(
                START, tools_pb2.StartEpisodeResponse, instance_id=iid, task_json=self.env_task),
                grpc.StatusCode.ALREADY_EXISTS)
            self.expect(p, "CloseEpisode", await self.env(CLOSE, tools_pb2.CloseEpisodeResponse, instance_id=iid), ok)
            self.expect(p, "CloseEpisode of a closed id", await self.env(
                CLOSE, tools_pb2.CloseEpisodeResponse, instance_id=iid), grpc.StatusCode.NOT_FOUND)
        return result

    async def run(self) -> list[RuleResult]:
        rules = [self.health, self.list_tools, self.call_tools, self.unknown_tool, self.invalid_arguments,
                 self.instance_kwargs, self.deadline]
        if self.security.token:
            rules.append(self.auth)
        if self.security.tls is not None:
            rules.append(self.tls)
        results = [await rule() for rule in rules]
        if await self.serves_environments():
            results += [await self.episode(), await self.episode_errors()]
        return results


def _instance() -> str:
    return f"conformance-{uuid.uuid4().hex[:12]}"


def check(endpoint: str, security: EndpointSecurity = PLAINTEXT, timeout_s: float = 30.0, env_task: str = "{}",
          notes: list[str] | None = None) -> list[RuleResult]:
    """Every rule against the server at `endpoint` -> the results, in rule order; `notes` gets what
    was not checked and why."""
    checker = Checker(endpoint, security, timeout_s, env_task)
    results = asyncio.run(checker.run())
    if notes is not None:
        notes += checker.notes
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p)
    p.add_argument("--env-task", default="{}", help="the task JSON of the episodes the environment rules start "
                                                    "(default {})")


def main_from_args(a: argparse.Namespace) -> int:
    def run(endpoint: str, security: EndpointSecurity) -> list[RuleResult]:
        notes: list[str] = []
        results = check(endpoint, security, a.timeout_s, a.env_task, notes)
        for note in notes:
            print(f"note: {note}")
        return results
    return run_and_report(a, run)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tandem.tools.conformance",
                                description="check a tool server against the ToolService contract")
    add_arguments(p)
    return main_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
