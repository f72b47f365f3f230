"""GrpcToolCaller (tandem/tools/grpc_caller.py) against real tool servers in their own processes:
the example calculator (locked with TLS and a token) and a faulty server (tests/helpers/
faulty_tool_server.py). Every failure comes back as an observation with ok=False, never an exception
and never an empty text; a slow call does not hold the others (shown by order of events: the slow
tool answers only once a later call releases it)."""
import asyncio
import json
import sys

import pytest
from certs import make_certs
from server_process import ROOT, server_process

from tandem.rpc.security import EndpointSecurity
from tandem.rpc.tls import TLSFiles
from tandem.tools.blocking import BlockingToolCaller
from tandem.tools.calls import ToolCall, ToolResult
from tandem.tools.grpc_caller import GrpcToolCaller
from tandem.tools.tool_config import ToolRoute

FAULTY = ["echo", "wait", "release", "fail", "oops", "flaky", "empty", "kwargs"]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    port = tmp_path_factory.mktemp("faulty") / "port"
    with server_process([sys.executable, str(ROOT / "tests/helpers/faulty_tool_server.py"), "--port-file",
                         str(port)], port) as endpoint:
        yield endpoint


def caller(endpoint: str, **kw) -> GrpcToolCaller:
    return GrpcToolCaller({name: ToolRoute(endpoint) for name in FAULTY}, **kw)


def call_all(endpoint: str, calls: list[ToolCall]) -> list[ToolResult]:
    """The calls at once, on a caller of their own."""
    async def run():
        c = caller(endpoint)
        try:
            return await c.call(calls)
        finally:
            await c.close()

    return asyncio.run(run())


def test_failures_become_observations_in_order(faulty):
    calls = [ToolCall("echo", {"text": "hi"}), ToolCall("fail", {}), ToolCall("oops", {}), ToolCall("empty", {}),
             ToolCall("nope", {}), ToolCall("echo", ["not", "an", "object"]), ToolCall("echo", {"x": float("nan")}),
             ToolCall("echo", '{"text": "from text"}'), ToolCall("echo", "{broken"), ToolCall("echo", {})]
    results = call_all(faulty, calls)
    assert results[0] == ToolResult("hi", True)
    assert results[1] == ToolResult("error: tool 'fail' failed: INTERNAL: tool exploded", False)
    assert results[2] == ToolResult("oops: division by zero", False)  # the tool's own error, as it said it
    assert results[3] == ToolResult("error: tool 'empty' answered an empty observation", False)
    assert results[4].text.startswith("error: unknown tool 'nope'; the tools are: echo, empty, fail")
    assert results[5].text == "error: tool 'echo': the arguments must be a JSON object, got list"
    assert results[6].text.startswith("error: tool 'echo': the arguments are not JSON: Out of range float")
    assert results[7] == ToolResult("from text", True)  # arguments the parser left as JSON text
    assert results[8].text.startswith("error: tool 'echo': the arguments are not valid JSON")
    assert results[9].text == "error: tool 'echo' failed: INVALID_ARGUMENT: missing required property 'text'"
    assert not any(r.ok for r in results[1:7] + results[8:]) and all(r.text for r in results)


def test_a_calls_kwargs_reach_the_server_as_sent(faulty):
    """A call's kwargs (a row's verl tools_kwargs entry) arrive as instance_kwargs_json, only with that
    call; kwargs that are not a JSON object fail that call alone, before anything is sent."""
    entry = {"create_kwargs": {"ground_truth": "72"}, "execute_kwargs": {"strict": True}}
    calls = [ToolCall("kwargs", {}, kwargs=entry), ToolCall("kwargs", {}), ToolCall("kwargs", {}, kwargs=["x"]),
             ToolCall("kwargs", {}, kwargs={"create_kwargs": {"x": float("nan")}}), ToolCall("kwargs", {}, kwargs={})]
    sent, none, listed, nan, empty = call_all(faulty, calls)
    assert sent.ok and json.loads(sent.text) == entry
    assert none == ToolResult("(none)", True)
    assert listed == ToolResult("error: tool 'kwargs': the row's tools_kwargs for it must be a JSON object, got list",
                                False)
    assert not nan.ok and nan.text.startswith("error: tool 'kwargs': the row's tools_kwargs are not JSON: Out of range")
    assert empty == ToolResult("{}", True)


def test_retries_timeouts_and_a_dead_server(faulty):
    async def run():
        c = caller(faulty, timeout_s=0.5, retry_backoff_s=0.01)
        few = caller(faulty, max_retries=1, retry_backoff_s=0.01)
        dead = GrpcToolCaller({"echo": ToolRoute("127.0.0.1:1")}, timeout_s=1, max_retries=2, retry_backoff_s=0.01)
        try:
            return (await c.call([ToolCall("flaky", {"key": "a"}), ToolCall("wait", {"key": "never released"})]),
                    await few.call([ToolCall("flaky", {"key": "b"})]), await dead.call([ToolCall("echo", {"text": "x"})]))
        finally:
            for x in (c, few, dead):
                await x.close()

    (flaky, wait), (gave_up,), (unreachable,) = asyncio.run(run())
    assert flaky == ToolResult("ok after 3 attempts", True)  # UNAVAILABLE twice, retried
    assert wait == ToolResult("error: tool 'wait' timed out after 0.5 s", False)
    assert gave_up == ToolResult("error: tool 'flaky' failed: UNAVAILABLE: warming up", False)
    assert not unreachable.ok and unreachable.text.startswith("error: tool 'echo' failed: UNAVAILABLE:")
    assert unreachable.text.endswith("(retried for 1 s)")  # nobody there: retried until the deadline


def test_a_slow_call_does_not_hold_the_others(faulty):
    """`wait` answers only after a `release` of its key: if fast calls queued behind the slow one,
    the fast results could not come first and the release below would never be sent (the call would
    time out instead of answering "waited")."""
    async def run():
        c = caller(faulty, timeout_s=60)
        try:
            order = []
            calls = [ToolCall("wait", {"key": "first"}), ToolCall("echo", {"text": "a"}), ToolCall("echo", {"text": "b"})]
            async for i, result in c.call_as_completed(calls):
                order.append((i, result.text))
                if len(order) == 2:  # both fast ones are in while `wait` still blocks: let it go
                    assert await c.call([ToolCall("release", {"key": "first"})]) == [ToolResult("released", True)]
            # the same through the protocol's call(): one row's batch waits, another's returns
            slow = asyncio.create_task(c.call([ToolCall("wait", {"key": "second"})]))
            fast = await c.call([ToolCall("echo", {"text": "c"})])
            assert not slow.done()
            await c.call([ToolCall("release", {"key": "second"})])
            return order, fast, await slow
        finally:
            await c.close()

    order, fast, slow = asyncio.run(run())
    assert sorted(order[:2]) == [(1, "a"), (2, "b")] and order[2] == (0, "waited")
    assert fast == [ToolResult("c", True)] and slow == [ToolResult("waited", True)]


def truth(answer: str) -> dict:
    return {"create_kwargs": {"ground_truth": answer}}  # verl's gsm8k rows' tools_kwargs entry


def test_the_example_calculator_locked_with_tls_and_a_token(tmp_path):
    certs = make_certs(tmp_path / "certs")
    (tmp_path / "token").write_text("tool-secret\n")
    cmd = [sys.executable, "-m", "tandem.services.tools.examples.server", "--port-file", str(tmp_path / "port"),
           "--token-file", str(tmp_path / "token"), "--tls-cert", certs.server_cert, "--tls-key", certs.server_key]
    locked = EndpointSecurity(TLSFiles(ca_file=certs.ca), "tool-secret")

    async def run(endpoint):
        good = GrpcToolCaller({n: ToolRoute(endpoint, locked) for n in ("calculator", "add", "multiply",
                                                                        "calc_gsm8k_reward")})
        no_token = GrpcToolCaller({"add": ToolRoute(endpoint, EndpointSecurity(TLSFiles(ca_file=certs.ca)))})
        try:
            return (await good.call([ToolCall("calculator", {"expression": "99999999999999999999*99999999999999999999"}),
                                     ToolCall("multiply", {"a": "-12345678901234567890", "b": "3"}),
                                     ToolCall("calculator", {"expression": "2 +"}),
                                     ToolCall("add", {"a": 1, "b": "2"}),
                                     # verl's gsm8k tool reads the row's ground truth; the calculator ignores kwargs
                                     ToolCall("calc_gsm8k_reward", {"answer": "So $1,234."}, kwargs=truth("1234")),
                                     ToolCall("calc_gsm8k_reward", {"answer": "72"}, kwargs={"create_kwargs": "72"}),
                                     ToolCall("calculator", {"expression": "1+1"}, kwargs=truth("3"))]),
                    await no_token.call([ToolCall("add", {"a": "1", "b": "2"})]))
        finally:
            await good.close()
            await no_token.close()

    with server_process(cmd, tmp_path / "port") as endpoint:
        results, (refused,) = asyncio.run(run(endpoint))
    assert results[0] == ToolResult(str(99999999999999999999 ** 2), True)
    assert results[1] == ToolResult("-37037036703703703670", True)
    assert results[2] == ToolResult("calculator: expected a number, got the end in '2 +'", False)
    assert results[3] == ToolResult("error: tool 'add' failed: INVALID_ARGUMENT: add: property 'a' must be a string, "
                                    "got int", False)
    assert results[4] == ToolResult("answer '1234': correct, score 1.0", True)
    assert results[5] == ToolResult("error: tool 'calc_gsm8k_reward' failed: INVALID_ARGUMENT: instance_kwargs_json: "
                                    "create_kwargs must be a JSON object, got str", False)
    assert results[6] == ToolResult("2", True)
    assert refused.text.startswith("error: tool 'add' failed: UNAUTHENTICATED: missing bearer token")


def test_blocking_caller_for_the_engine_thread(faulty):
    """The engine is synchronous: it submits a row's calls and keeps decoding; a slow row's future
    stays pending while another row's is answered."""
    tools = BlockingToolCaller(caller(faulty, timeout_s=60))
    try:
        slow = tools.submit([ToolCall("wait", {"key": "blocking"})])
        assert tools.call([ToolCall("echo", {"text": "fast"}), ToolCall("oops", {})]) == \
            [ToolResult("fast", True), ToolResult("oops: division by zero", False)]
        assert not slow.done()
        assert tools.call([ToolCall("release", {"key": "blocking"})]) == [ToolResult("released", True)]
        assert slow.result(timeout=60) == [ToolResult("waited", True)]
    finally:
        tools.close()
    assert not tools._thread.is_alive()
