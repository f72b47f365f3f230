"""`python -m tandem.reward.conformance HOST:PORT` holds reward services to the RewardService contract:
the Node.js example (built from the proto alone; `npm ci` in services/reward/examples/node, as
.ci/run does) passes plain and locked (TLS + token), so do the Python example and Tandem's own
reward service; a deliberately broken Python server fails with a message naming each broken rule."""
import subprocess
import sys

from certs import make_certs
from conformance_expect import assert_passes, node_for
from server_process import ROOT, server_process

from tandem.reward.conformance import check
from tandem.rpc.security import EndpointSecurity
from tandem.rpc.tls import TLSFiles

NODE_DIR = ROOT / "services" / "reward" / "examples" / "node"
HELPERS = ROOT / "tests" / "helpers"
ALWAYS = ["health", "scores_per_row", "invalid_argument", "deadline"]


def _node() -> str:
    return node_for(NODE_DIR)


def test_node_server_passes(tmp_path):
    with server_process([_node(), "server.js", "--port", "0", "--port-file", str(tmp_path / "port")],
                        tmp_path / "port", cwd=NODE_DIR) as endpoint:
        assert_passes(check(endpoint), ALWAYS)


def test_node_server_locked_passes_with_auth_and_tls(tmp_path):
    certs = make_certs(tmp_path / "certs")
    (tmp_path / "token").write_text("node-secret\n")
    cmd = [_node(), "server.js", "--port", "0", "--port-file", str(tmp_path / "port"),
           "--token-file", str(tmp_path / "token"), "--tls-cert", certs.server_cert, "--tls-key", certs.server_key]
    with server_process(cmd, tmp_path / "port", cwd=NODE_DIR) as endpoint:
        locked = EndpointSecurity(TLSFiles(ca_file=certs.ca), "node-secret")
        assert_passes(check(endpoint, locked), ALWAYS + ["auth", "tls"])
        # the command line, as a user runs it
        r = subprocess.run([sys.executable, "-m", "tandem.reward.conformance", endpoint, "--tls-ca", certs.ca,
                            "--token-file", str(tmp_path / "token")], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and "6 passed, 0 failed" in r.stdout, r.stdout + r.stderr


def test_python_example_and_tandem_reward_service_pass(tmp_path):
    (tmp_path / "token").write_text("py-secret")
    example = [sys.executable, "-m", "tandem.services.reward.examples.external_server", "--port-file",
               str(tmp_path / "example.port"), "--token-file", str(tmp_path / "token")]
    tandem = [sys.executable, "-m", "tandem.services.reward", "--port-file", str(tmp_path / "tandem.port"),
              "reward_model.default_rule=arithmetic"]  # takes a run at start (with no config it would wait for one)
    with server_process(example, tmp_path / "example.port") as a, server_process(tandem, tmp_path / "tandem.port") as b:
        assert_passes(check(a, EndpointSecurity(token="py-secret")), ALWAYS + ["auth"])
        assert_passes(check(b), ALWAYS)


def test_broken_server_fails_naming_each_broken_rule(tmp_path):
    (tmp_path / "token").write_text("never-checked")
    cmd = [sys.executable, str(HELPERS / "faulty_reward_server.py"), "--port-file", str(tmp_path / "port"),
           "--break", "health,rows,invalid_argument,deadline,auth", "--token-file", str(tmp_path / "token")]
    with server_process(cmd, tmp_path / "port") as endpoint:
        r = subprocess.run([sys.executable, "-m", "tandem.controller", "conformance", endpoint, "--token-file",
                            str(tmp_path / "token"), "--timeout-s", "20"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    for rule in ["health", "scores_per_row", "invalid_argument", "deadline", "auth"]:
        assert f"FAIL {rule}" in out, out
    assert "health: grpc.health.v1 Check('') failed with UNIMPLEMENTED" in out
    assert "scores_per_row: all columns: 4 scores for 5 rows" in out
    assert "invalid_argument: a request without response_text was answered OK, not INVALID_ARGUMENT" in out
    assert "deadline: a 5-row batch was not scored within a 5 s deadline: DEADLINE_EXCEEDED" in out
    assert "auth: a call with no token was answered OK, not UNAUTHENTICATED" in out
    assert "0 passed, 5 failed: health, scores_per_row, invalid_argument, deadline, auth" in out


def test_a_server_without_the_failures_field_still_conforms(tmp_path):
    """Failed rows are optional: a server listing some rows as failures passes as long as the rows
    it lists exist (the faulty server in `rows` mode fails rows starting with "1" or empty)."""
    cmd = [sys.executable, str(HELPERS / "faulty_reward_server.py"), "--port-file", str(tmp_path / "port"),
           "--fault", "rows"]
    with server_process(cmd, tmp_path / "port") as endpoint:
        assert_passes(check(endpoint), ALWAYS)
