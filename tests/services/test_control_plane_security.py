"""The control plane is locked: a long-lived service with a token refuses Configure and Release without
it; a run's reward function is imported only from the service's --allow-dir directories (a path
outside, a symbolic link out included, is INVALID_ARGUMENT and never imported); a service or `tandem
serve` bound beyond loopback without a token refuses to start unless told --insecure; `tandem serve`
with a token refuses callers without it, and the services its pool starts require the pool's token.

Real processes (a reward service holds no model: the cheapest to start)."""
import asyncio
import os
import subprocess
import sys

import grpc
import pytest
from rpc_expect import expect_error
from server_process import server_process

from tandem.config import load_config, to_yaml
from tandem.controller.clients import LifecycleClient
from tandem.controller.service.client import ControllerClient
from tandem.rpc.errors import TandemError
from tandem.rpc.security import EndpointSecurity

UNAUTHENTICATED, INVALID = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT
SERVICE = [sys.executable, "-m", "tandem.services.reward"]


@pytest.fixture
def files(tmp_path):
    """A token, an allowed directory and one outside it, each with a reward file that leaves a mark
    when imported, and a link from the allowed directory to the outside file."""
    (tmp_path / "token").write_text("s3cret-token\n")
    for name in ("allowed", "outside"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "reward.py").write_text(
            f"open({str(tmp_path / (name + '.imported'))!r}, 'w').close()\n"
            "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    os.symlink(tmp_path / "outside" / "reward.py", tmp_path / "allowed" / "link.py")
    return tmp_path


def run_yaml(reward_file) -> str:
    return to_yaml(load_config(None, [f"custom_reward_function.path={reward_file}"]))


def test_lifecycle_calls_need_the_token_and_code_comes_only_from_allowed_dirs(files):
    token = EndpointSecurity(token="s3cret-token")
    cmd = [*SERVICE, "--port-file", str(files / "port"), "--allow-dir", str(files / "allowed"),
           "--long-lived", f"services.reward.auth.token_file={files / 'token'}"]

    async def main(endpoint):
        anyone = LifecycleClient(endpoint, timeout_s=60)
        await expect_error(anyone.configure("r1", run_yaml(files / "allowed" / "reward.py")), UNAUTHENTICATED,
                           "missing bearer token")
        await expect_error(anyone.release(), UNAUTHENTICATED, "missing bearer token")
        await expect_error(LifecycleClient(endpoint, timeout_s=60, security=EndpointSecurity(token="guess"))
                           .release(), UNAUTHENTICATED, "invalid bearer token")
        owner = LifecycleClient(endpoint, timeout_s=120, security=token)
        for name in ("outside/reward.py", "allowed/link.py"):  # the link resolves outside
            await expect_error(owner.configure("r1", run_yaml(files / name)), INVALID,
                               f"custom_reward_function.path: '{files / name}' is outside the directories this "
                               f"service imports code from ({files / 'allowed'}; start it with --allow-dir DIR); "
                               "not imported")
        assert not (files / "outside.imported").exists() and (await owner.describe())["run_id"] == ""
        await owner.configure("r2", run_yaml(files / "allowed" / "reward.py"))  # control: inside is taken
        assert (files / "allowed.imported").exists()
        assert await owner.release("r2") == "r2"

    with server_process(cmd, files / "port", timeout_s=180) as endpoint:
        asyncio.run(main(endpoint))


def test_a_service_beyond_loopback_needs_a_token_or_insecure(tmp_path, capsys):
    from tandem.serving.process import parse_args

    with pytest.raises(SystemExit) as refused:  # its arguments, in process: what the command line does first
        parse_args("reward", ["--host", "0.0.0.0", "--port-file", str(tmp_path / "port")])
    assert refused.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == (
        "python -m tandem.services.reward: error: --host 0.0.0.0: 0.0.0.0 is reachable beyond loopback and no "
        "bearer token is set (services.reward.auth.token_file or .token_env): set one, or pass --insecure to "
        "serve without")
    with server_process([*SERVICE, "--host", "0.0.0.0", "--insecure", "--port-file", str(tmp_path / "port")],
                        tmp_path / "port", timeout_s=180) as endpoint:
        async def describe():
            return await LifecycleClient(endpoint, timeout_s=60).describe()
        assert asyncio.run(describe())["role"] == "reward"  # serving, without a token


def test_the_controller_service_and_its_pool_need_their_tokens(files, capsys):
    from tandem.controller.service.cli import main

    state = files / "state"
    serve = ["serve", "--state-dir", str(state), "--port", "0", "--http-port", "0", "--port-file", str(files / "port")]
    assert main([*serve, "--host", "0.0.0.0"]) == 2  # in process: refused before anything starts
    assert not state.exists() and capsys.readouterr().err.strip() == (
        "tandem serve: --host 0.0.0.0: 0.0.0.0 is reachable beyond loopback and no bearer token is set: give "
        "--token-file or --token-env (and --tls-cert/--tls-key), or pass --insecure to serve without")
    cmd = [sys.executable, "-m", "tandem.controller", *serve, "--token-file", str(files / "token"),
           "--allow-dir", str(files / "allowed"), "--start", "reward"]
    with server_process(cmd, files / "port", timeout_s=300) as address:
        with pytest.raises(TandemError, match="missing bearer token") as e:
            ControllerClient(address).list()
        assert e.value.code == UNAUTHENTICATED
        owner = ControllerClient(address, security=EndpointSecurity(token="s3cret-token"))
        assert owner.list() == []
        with pytest.raises(TandemError, match=r"custom_reward_function.path: .* is outside the directories") as e:
            owner.submit(run_yaml(files / "outside" / "reward.py"), [])
        assert e.value.code == INVALID and not (files / "outside.imported").exists() and owner.list() == []
        listed = subprocess.run([sys.executable, "-m", "tandem.controller", "list", "--controller", address,
                                 "--token-file", str(files / "token")], capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0, listed.stderr
        # the pool's reward service: its own token, which the controller made and keeps in the state dir
        endpoint = __import__("json").loads((state / "services" / "pool.json").read_text())["reward"]["endpoint"]
        pool_token = (state / "services" / "pool.token").read_text().strip()
        assert pool_token != "s3cret-token" and oct((state / "services" / "pool.token").stat().st_mode)[-3:] == "600"

        async def describe(security):
            return await LifecycleClient(endpoint, timeout_s=60, security=security).describe()
        with pytest.raises(TandemError, match="missing bearer token"):
            asyncio.run(describe(EndpointSecurity()))
        assert asyncio.run(describe(EndpointSecurity(token=pool_token)))["role"] == "reward"
