"""The example external reward service (services/reward/examples/external_server.py): it speaks
the RewardService contract with nothing of Tandem but the generated stubs, the controller's
RewardClient can call it, and `tandem run` attaches to it via services.reward.endpoint."""
import ast
import asyncio
import pathlib
import signal
import subprocess
import sys
import time

import grpc
import pytest
import torch

from tandem.controller.clients import RewardClient
from tandem.data.batch import DataProto
from tandem.rpc.errors import InvalidArgument
from tandem.v1 import data_pb2, reward_pb2

ROOT = pathlib.Path(__file__).resolve().parents[2]
SERVER = ROOT / "services" / "reward" / "examples" / "external_server.py"
TINY_RUN = ["trainer.sft.total_steps=0", "trainer.total_training_steps=1", "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2", "data.builtin_train_size=40", "data.builtin_val_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "services.actor.torch_threads=1",
            "data.max_prompt_length=16", "data.max_response_length=4", "trainer.test_freq=0",
            "trainer.logger=[jsonl]", "trainer.experiment_name=external_reward"]


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    port_file = tmp_path_factory.mktemp("external_reward") / "reward.port"
    proc = subprocess.Popen([sys.executable, "-m", "tandem.services.reward.examples.external_server",
                             "--port", "0", "--port-file", str(port_file)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None, f"server exited {proc.returncode}: {proc.stdout.read()}"
            assert time.monotonic() < deadline, "external reward server did not start in 30 s"
            time.sleep(0.05)
        yield f"127.0.0.1:{int(port_file.read_text())}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=15)
    assert rc == 0, f"server did not stop cleanly on SIGTERM: exit {rc}"
    assert not port_file.exists()


def test_imports_only_generated_stubs():
    tree = ast.parse(SERVER.read_text())
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            mods.update([node.module] + [f"{node.module}.{a.name}" for a in node.names])
    tandem = {m for m in mods if m.split(".")[0] in ("tandem", "services", "controller")}
    assert tandem == {"tandem.v1", "tandem.v1.data_pb2", "tandem.v1.reward_pb2", "tandem.v1.reward_pb2_grpc"}


def test_scores_and_errors(endpoint):
    async def main():
        async with RewardClient(endpoint, timeout_s=30) as client:
            await client.wait_healthy(timeout_s=10)
            batch = DataProto(
                tensors={"response_mask": torch.ones(6, 4, dtype=torch.int64)},
                columns={"response_text": ["168", "it is 168.", "1680", "16.8", "7 ", "no number"],
                         "ground_truth": ["168", "168", "168", "16", "7", "3"],
                         "data_source": ["arithmetic"] * 6})
            assert await client.score(batch) == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
            # non-string values travel as json=true columns and are decoded
            as_json = DataProto(columns={"response_text": ["x 42 y", "41"], "ground_truth": [42, 42]})
            assert await client.score(as_json) == [1.0, 0.0]
            assert await client.score(DataProto(columns={"response_text": [], "ground_truth": []})) == []

            with pytest.raises(InvalidArgument, match="'ground_truth'"):
                await client.score(DataProto(columns={"response_text": ["1"]}))
            ragged = data_pb2.Batch(columns=[
                data_pb2.Column(name="response_text", values=["1", "2"]),
                data_pb2.Column(name="ground_truth", values=["1"])])
            with pytest.raises(InvalidArgument, match="column 'ground_truth' has 1 values"):
                await client.call("Score", reward_pb2.ScoreRequest(batch=ragged))
            bad_json = data_pb2.Batch(columns=[
                data_pb2.Column(name="response_text", values=["1"]),
                data_pb2.Column(name="ground_truth", values=["{"], json=True)])
            try:
                await client.call("Score", reward_pb2.ScoreRequest(batch=bad_json))
            except InvalidArgument as e:
                assert e.code == grpc.StatusCode.INVALID_ARGUMENT and "'ground_truth'" in str(e)
            else:
                raise AssertionError("invalid JSON accepted")

    asyncio.run(main())


def test_tandem_run_attaches_to_it(endpoint, tmp_path):
    r = subprocess.run([sys.executable, "-m", "tandem.controller", "run", *TINY_RUN,
                        f"trainer.default_local_dir={tmp_path}", f"services.reward.endpoint={endpoint}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    (run_dir,) = tmp_path.iterdir()
    logs = {p.name for p in (run_dir / "logs").iterdir()}
    assert "actor.log" in logs and "reward.log" not in logs, logs
    assert (run_dir / "metrics.jsonl").read_text().count("actor/pg_loss") == 1
