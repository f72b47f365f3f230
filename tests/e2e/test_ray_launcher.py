"""`tandem run` with trainer.launcher=ray on a local two-node Ray cluster, against the local launcher.

The cluster is Ray's own `ray.cluster_utils.Cluster`: two nodes (separate raylets) on this machine,
one with the custom resource `node_a`, the other with `node_b`; the config pins the actor (two
data-parallel ranks, each its own Ray actor in one placement group, meeting over TCP at rank 0's
node) to node_a and the standalone rollout and the reward to node_b. After step 1 the Ray actor of
the actor service's rank 1 is killed (kill -9 of its process; the rank dies with it): the run
restarts the service (Ray brings the actor back in its bundle, the launcher starts both ranks again)
and goes back to its checkpoint. Checks: the run completes, each service rank logged the Ray node it
ran on and those are the nodes its resources name (after the restart too), and its metrics equal
those of the same config under the local launcher, uninterrupted (every non-timing key).

Ray runs in its single-machine mode (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: every node on
127.0.0.1), set before Ray is imported, so no traffic leaves the loopback interface.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
from kill_runs import run_and_kill

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="trainer.launcher=ray needs Ray: pip install -e '.[ray]' (not installed)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ["trainer.sft.total_steps=3", "trainer.sft.batch_size=8", "trainer.total_training_steps=2",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2", "data.builtin_train_size=200",
        "data.builtin_val_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "services.actor.torch_threads=1", "trainer.test_freq=0", "trainer.logger=[console,jsonl]",
        "actor_rollout_ref.rollout.mode=standalone", "services.actor.world_size=2",
        "trainer.sft.stop_at_accuracy=null",  # 3 SFT steps: no dev split
        "services.insecure=true"]  # Ray's services bind their node's address; this test gives them no token
PLACEMENT = ["services.actor.ray.resources={node_a: 1}", "services.rollout.ray.resources={node_b: 1}",
             "services.reward.ray.resources={node_b: 1}"]
VOLATILE = ("timing_s/", "perf/", "trainer/restarts")


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    for attempt in range(2):  # a raylet must register within Ray's fixed 30 s; a loaded machine may miss it once
        try:
            c = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "resources": {"node_a": 4},
                                                              "include_dashboard": False})
            worker = c.add_node(num_cpus=4, resources={"node_b": 4})
            c.wait_for_nodes()
            break
        except Exception:  # noqa: BLE001 - Ray raises a bare Exception on a slow raylet
            if attempt:
                raise
    c.nodes_by_resource = {"node_a": c.head_node.node_id, "node_b": worker.node_id}
    yield c
    c.shutdown()


def run(tmp_path, name: str, overrides: list[str], env: dict) -> pathlib.Path:
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "tandem.controller", "run", *TINY, *overrides,
                           f"trainer.default_local_dir={out}", f"trainer.experiment_name={name}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    (run_dir,) = out.iterdir()
    return run_dir


def metrics(run_dir: pathlib.Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def placements(run_dir: pathlib.Path) -> dict[tuple[str, int], str]:
    """{(role, rank): Ray node id} from each rank's `service.process` log line."""
    found = {}
    for log in (run_dir / "logs").glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if '"service.process"' in line:
                event = json.loads(line)
                found[(event["role"], event["rank"])] = event["node_id"]
    return found


def test_ray_two_nodes_same_metrics_as_local(cluster, tmp_path):
    node_of = cluster.nodes_by_resource
    assert len(set(node_of.values())) == 2

    ray_env = dict(os.environ, RAY_ADDRESS=cluster.address)
    rc, out, err, ray_dir, _ = run_and_kill(
        [*TINY, "trainer.launcher=ray", *PLACEMENT, f"trainer.default_local_dir={tmp_path / 'on_ray'}",
         "trainer.experiment_name=on_ray"], [("actor", 1, 1, signal.SIGKILL, "parent")], timeout_s=900, env=ray_env)
    assert rc == 0, f"stdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    ray_dir = pathlib.Path(ray_dir)
    (died,) = [line for line in out.splitlines() if " service died " in line]  # how each rank was
    assert died.startswith("tandem: the actor service died (rank ") and died.endswith("(restart 1 of 3)"), died
    summary = json.loads((ray_dir / "summary.json").read_text())
    assert summary["restarts"] == 1 and [pathlib.Path(p).name for p in summary["recovered_from"]] == ["global_step_0"]
    starts = (ray_dir / "logs" / "actor.rank1.log").read_text().count('"service.process"')
    assert starts == 2  # rank 1 started again, by the actor Ray brought back
    placed = placements(ray_dir)  # each rank's latest start
    assert placed == {("actor", 0): node_of["node_a"], ("actor", 1): node_of["node_a"],
                      ("rollout", 0): node_of["node_b"], ("reward", 0): node_of["node_b"]}
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        # the launcher removed its placement groups and actors at the end of the run
        assert [pg for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"] == []
    finally:
        ray.shutdown()

    local_dir = run(tmp_path, "local", [], dict(os.environ))
    assert set(placements(local_dir).values()) == {None}  # no Ray node under the local launcher
    got, want = metrics(ray_dir), metrics(local_dir)
    assert [r["step"] for r in got if "actor/pg_loss" in r] == [1, 2]
    assert got == want
