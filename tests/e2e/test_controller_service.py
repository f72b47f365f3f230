"""The controller service (`tandem serve`) with the CLI's client, on CPU with tiny runs: bad
submissions rejected before anything is queued, two runs back to back on the same service
processes with the results of `tandem run`, rollout replicas from the pool, a running run
cancelled, and the status page in a real headless browser (Chromium)."""
import json
import os
import shutil
import subprocess
import sys
import time

import grpc
import pytest
from controller_proc import ControllerProcess, step_metrics
from test_tandem_run import TINY, run_tandem

from tandem.rpc.errors import TandemError

PPO = ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.mode=standalone", "algorithm.use_kl_in_reward=true",
       "algorithm.kl_ctrl.type=adaptive", "trainer.logger=[jsonl]", "trainer.total_training_steps=3"]
LONG_GRPO = ["trainer.total_training_steps=400", "trainer.save_freq=4", "trainer.logger=[jsonl]"]


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    ctl = ControllerProcess(tmp_path_factory.mktemp("controller"), start_roles="actor,reward,rollout,critic").start()
    yield ctl
    ctl.stop()


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def submit(ctl, runs_dir, name, *overrides) -> str:
    return ctl.client.submit("", [*TINY, f"trainer.default_local_dir={runs_dir}", f"trainer.experiment_name={name}",
                                  *overrides])["id"]


BAD = [  # (overrides, the key the error must name)
    (["data.no_such_key=1"], "data.no_such_key"),
    (["data.train_batch_size=many"], "data.train_batch_size"),
    (["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"], "services.actor.world_size"),
    (["services.actor.world_size=3", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3"],
     "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"),  # 4 heads over 3 ranks
    (["data.train_files=/no/such/train.parquet"], "data.train_files"),
]


def test_bad_submissions_are_rejected_and_nothing_is_queued(controller, runs_dir):
    before = controller.client.list()
    for overrides, key in BAD:
        with pytest.raises(TandemError) as e:
            submit(controller, runs_dir, "bad", *overrides)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and key in str(e.value), (overrides, str(e.value))
    with pytest.raises(TandemError) as e:  # a YAML body that is not a config
        controller.client.submit("- just\n- a list\n", [])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert controller.client.list() == before
    # the CLI says the same, naming the key, and exits 2
    cli = subprocess.run([sys.executable, "-m", "tandem.controller", "submit", "--controller", controller.client.address,
                          "data.no_such_key=1"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "INVALID_ARGUMENT" in cli.stderr and "data.no_such_key" in cli.stderr


def test_back_to_back_runs_share_the_services_and_equal_tandem_run(controller, runs_dir, tmp_path):
    pool = controller.pool()
    a = submit(controller, runs_dir, "ppo_a", *PPO)
    b = submit(controller, runs_dir, "ppo_b", *PPO)  # queued behind a
    assert controller.client.get(b)[0]["state"] in ("queued", "running")
    ra, rb = controller.wait_ended(a), controller.wait_ended(b)
    assert ra["state"] == rb["state"] == "succeeded", (ra["error"], rb["error"])
    assert ra["run_dir"] != rb["run_dir"] and os.path.basename(ra["run_dir"]) == a
    assert rb["started"] >= ra["finished"]  # one after another
    # the same service processes (rank 0 of each role) for both runs, the pool's own
    assert ra["service_pids"] == rb["service_pids"]
    assert {role: pids[0] for role, pids in ra["service_pids"].items()} == {r: e["pid"] for r, e in pool.items()}
    assert set(ra["service_pids"]) == {"actor", "reward", "rollout", "critic"}

    rc, _, err, _ = run_tandem([*TINY, *PPO, f"trainer.default_local_dir={tmp_path}",
                                  "trainer.experiment_name=ppo_alone"])
    assert rc == 0, err[-3000:]
    (alone,) = tmp_path.iterdir()
    want = step_metrics(alone)
    assert sorted(want) == [1, 2, 3] and want[2] != want[3]  # the steps really differ
    assert step_metrics(ra["run_dir"]) == want
    assert step_metrics(rb["run_dir"]) == want
    summary = json.loads((alone / "summary.json").read_text())
    assert ra["summary"]["val_accuracy_final"] == summary["val_accuracy_final"]


def test_rollout_replicas_come_from_the_pool(controller, runs_dir):
    run = submit(controller, runs_dir, "replicas", *PPO[:-1], "trainer.total_training_steps=2",
                 "services.rollout.replicas=2")
    record = controller.wait_ended(run)
    assert record["state"] == "succeeded" and record["last_step"] == 2, record["error"]
    pool = controller.pool()
    assert {"rollout", "rollout-1"} <= set(record["service_pids"]) and pool["rollout-1"]["pid"] != pool["rollout"]["pid"]
    assert record["service_pids"]["rollout-1"][0] == pool["rollout-1"]["pid"]


def test_cancel_a_running_run_then_the_next_one_runs(controller, runs_dir):
    long = submit(controller, runs_dir, "long", *LONG_GRPO)
    after = submit(controller, runs_dir, "after", "trainer.total_training_steps=2", "trainer.logger=[jsonl]")
    running = controller.wait_for(long, lambda r: r["last_step"] >= 5, what="5 steps done")
    # the services it runs on are on its record while it runs
    pool = controller.pool()
    assert "actor" in running["service_pids"]
    assert all(pids[0] == pool[role]["pid"] for role, pids in running["service_pids"].items()), running
    t0 = time.monotonic()
    assert controller.client.cancel(long)["cancel_requested"]
    record = controller.wait_for(long, lambda r: r["state"] != "running", timeout_s=10, what="stopped within 10 s")
    assert record["state"] == "cancelled" and time.monotonic() - t0 < 10
    assert record["last_step"] < 400
    # save_freq asks for checkpoints: the last completed step was saved
    ckpts = os.listdir(os.path.join(record["run_dir"], "checkpoints"))
    assert f"global_step_{record['last_step']}" in ckpts, ckpts
    # the services are healthy and free
    for role, entry in controller.pool().items():
        described = describe(entry["endpoint"], controller.pool_security())
        assert described["run_id"] in ("", after), (role, described)
    done = controller.wait_ended(after)
    assert done["state"] == "succeeded" and done["last_step"] == 2, done["error"]
    logs = [e["body"] for e in controller.client.events(long) if e["kind"] == "log"]
    assert "cancel requested" in logs and any(line.startswith("stopped: ") for line in logs)
    with pytest.raises(TandemError) as e:  # an ended run cannot be cancelled
        controller.client.cancel(long)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "cancelled" in str(e.value)


def describe(endpoint: str, security) -> dict:
    import asyncio

    from tandem.controller.clients import LifecycleClient

    async def go():
        async with LifecycleClient(endpoint, timeout_s=30, security=security) as client:
            await client.wait_healthy(timeout_s=30)
            return await client.describe()

    return asyncio.run(go())


def test_cli_status_logs_and_list(controller, runs_dir):
    run = submit(controller, runs_dir, "cli", "trainer.total_training_steps=2", "trainer.logger=[jsonl]")
    env = dict(os.environ, TANDEM_CONTROLLER=controller.client.address)

    def tandem(*args):
        r = subprocess.run([sys.executable, "-m", "tandem.controller", *args], capture_output=True, text=True, timeout=600,
                           env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout

    follow = tandem("logs", "-f", run)  # returns when the run has ended
    assert "state: running" in follow and "step 2/2" in follow and follow.rstrip().endswith("state: succeeded")
    assert "sft 2/3" in follow  # the warm start's progress
    assert "step 2/2" in tandem("logs", "--from-step", "2", run) and "sft started" not in tandem(
        "logs", "--from-step", "2", run)
    status = tandem("status", run)
    assert "succeeded" in status and "latest metrics (step 2)" in status and "val/accuracy" in status
    assert run in tandem("list")
    with pytest.raises(AssertionError):
        tandem("status", "no-such-run")


@pytest.mark.skipif(not shutil.which("chromium") or not shutil.which("chromedriver"),
                    reason="needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)")
def test_status_page_in_a_headless_browser(controller, runs_dir, tmp_path):
    pytest.importorskip("selenium", reason="needs selenium (pip install -e .[browser])")
    from browser import chromium, save_screenshot

    if not any(r["state"] == "succeeded" for r in controller.client.list()):
        controller.wait_ended(submit(controller, runs_dir, "page", "trainer.total_training_steps=2"))
    queued = submit(controller, runs_dir, "page_queued", *LONG_GRPO)
    with chromium() as driver:
        driver.get(controller.http)
        rows = driver.find_elements("css selector", "tr.run")
        states = {r.find_element("css selector", ".state").text.split()[0] for r in rows}
        assert len(rows) == len(controller.client.list()) and "succeeded" in states and states & {"queued", "running"}
        done = next(r for r in controller.client.list() if r["state"] == "succeeded")
        driver.find_element("link text", done["id"]).click()
        assert done["id"] in driver.title
        charts = {c.get_attribute("data-key"): c for c in driver.find_elements("css selector", "svg.chart")}
        assert set(charts) == {"reward (critic/score/mean)", "held-out accuracy (val/accuracy)"}
        for chart in charts.values():
            assert chart.find_elements("css selector", "polyline"), "a curve with points"
        assert "val/accuracy" in driver.find_element("tag name", "body").text
        run_shot = save_screenshot(driver, tmp_path / "status_run.png")
        driver.get(controller.http)
        shot = save_screenshot(driver, tmp_path / "status_page.png")
    assert shot.stat().st_size > 10_000 and run_shot.stat().st_size > 10_000
    controller.client.cancel(queued)
