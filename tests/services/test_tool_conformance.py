"""`tandem conformance --contract tools HOST:PORT` holds tool servers to the ToolService contract (and
EnvironmentService's where served): the Python example (tools and an environment) passes locked with
TLS and a token, the Node.js example (built from the proto alone; `npm ci` in
services/tools/examples/node, as .ci/run does) passes plain and with a token, and a deliberately
broken server fails with one message per broken rule."""
import subprocess
import sys

from certs import make_certs
from conformance_expect import assert_passes, node_for
from server_process import ROOT, server_process

from tandem.rpc.security import EndpointSecurity
from tandem.rpc.tls import TLSFiles
from tandem.tools.conformance import check

NODE_DIR = ROOT / "services" / "tools" / "examples" / "node"
TOOL_RULES = ["health", "list_tools", "call_tools", "unknown_tool", "invalid_arguments", "instance_kwargs", "deadline"]
ENV_RULES = ["episode", "episode_errors"]


def _node() -> str:
    return node_for(NODE_DIR)


def test_python_example_locked_passes_every_rule(tmp_path):
    certs = make_certs(tmp_path / "certs")
    (tmp_path / "token").write_text("py-tools\n")
    cmd = [sys.executable, "-m", "tandem.services.tools.examples.server", "--port-file", str(tmp_path / "port"),
           "--token-file", str(tmp_path / "token"), "--tls-cert", certs.server_cert, "--tls-key", certs.server_key]
    with server_process(cmd, tmp_path / "port") as endpoint:
        notes = []
        results = check(endpoint, EndpointSecurity(TLSFiles(ca_file=certs.ca), "py-tools"), notes=notes)
        assert_passes(results, TOOL_RULES + ["auth", "tls"] + ENV_RULES)
        assert notes == []


def test_node_example_passes_plain_and_with_a_token(tmp_path):
    node = _node()
    (tmp_path / "token").write_text("node-tools")
    plain = [node, "server.js", "--port-file", str(tmp_path / "plain.port")]
    locked = [node, "server.js", "--port-file", str(tmp_path / "locked.port"), "--token-file", str(tmp_path / "token")]
    with server_process(plain, tmp_path / "plain.port", cwd=NODE_DIR) as a, \
            server_process(locked, tmp_path / "locked.port", cwd=NODE_DIR) as b:
        notes = []
        assert_passes(check(a, notes=notes), TOOL_RULES)
        assert notes and "EnvironmentService is not served" in notes[0]
        # the command line, as a user runs it
        r = subprocess.run([sys.executable, "-m", "tandem.controller", "conformance", "--contract", "tools", b,
                            "--token-file", str(tmp_path / "token")], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and "8 passed, 0 failed" in r.stdout, r.stdout + r.stderr
        assert "note: EnvironmentService is not served" in r.stdout


def test_broken_server_fails_naming_each_broken_rule(tmp_path):
    (tmp_path / "token").write_text("never-checked")
    broken = "health,list_tools,call_tools,unknown_tool,invalid_arguments,instance_kwargs,deadline,auth"
    cmd = [sys.executable, str(ROOT / "tests/helpers/faulty_tool_server.py"), "--port-file", str(tmp_path / "port"),
           "--break", broken, "--token-file", str(tmp_path / "token")]
    with server_process(cmd, tmp_path / "port") as endpoint:
        r = subprocess.run([sys.executable, "-m", "tandem.controller", "conformance", "--contract", "tools", endpoint,
                            "--token-file", str(tmp_path / "token"), "--timeout-s", "20"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    expected = [
        "health: grpc.health.v1 Check('') failed with UNIMPLEMENTED",
        "list_tools: tools[2]: the name 'echo' is listed twice",
        "list_tools: tools[3]: 'listy': function.parameters: must be a JSON Schema of type \"object\"",
        "call_tools: blank({}) answered an empty text",
        "unknown_tool: a call of the unlisted tool 'tandem_conformance_no_such_tool' was answered OK, not NOT_FOUND",
        "invalid_arguments: echo with arguments that are not JSON was answered OK, not INVALID_ARGUMENT",
        "invalid_arguments: echo with arguments that are a JSON list was answered OK, not INVALID_ARGUMENT",
        "invalid_arguments: echo with arguments without the required 'text' was answered OK, not INVALID_ARGUMENT",
        "instance_kwargs: echo({\"text\": \"1\"}) with kwargs it does not use failed with INVALID_ARGUMENT: "
        "instance_kwargs_json: not expected",
        "instance_kwargs: blank({}) with kwargs it does not use failed with INVALID_ARGUMENT",
        "deadline: a call under a 5 s deadline: echo failed with DEADLINE_EXCEEDED",
        "auth: a call with no token was answered OK, not UNAUTHENTICATED",
        "auth: a call with a wrong token was answered OK, not UNAUTHENTICATED",
        "0 passed, 8 failed: health, list_tools, call_tools, unknown_tool, invalid_arguments, instance_kwargs, "
        "deadline, auth",
    ]
    for line in expected:
        assert line in out, f"{line!r} not in:\n{out}"
    # nothing but the problems above (the last line is the summary)
    problems = [ln.strip() for ln in out.splitlines() if ln.startswith("     ")]
    assert len(problems) == len(expected) - 1, out
