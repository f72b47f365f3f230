"""deploy/compose.yaml's `cpu` profile, run as local processes: the compose file cannot drift from what works.

No docker engine is reachable here, so this reads the compose file and starts every service of
the `cpu` profile with its exact `command` and `environment`, in depends_on order, changing only
what a container would have differently: ${VAR:-default} interpolation as compose does it, the
`runs` volume's /runs becomes a temporary directory, each fixed port a free one (0.0.0.0 binds
become 127.0.0.1), and the controller finds each service at 127.0.0.1:<port> instead of the
compose DNS name <role>:<port> (one `services.<role>.endpoint` override each). Health is waited
for with each service's own healthcheck command. Then the controller's command runs the built-in
task (tiny, through TANDEM_OVERRIDES) against them.
"""
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ["trainer.sft.total_steps=3", "trainer.sft.batch_size=8", "trainer.total_training_steps=2",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2", "data.builtin_train_size=200",
        "data.builtin_val_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "services.actor.torch_threads=1", "trainer.test_freq=0", "trainer.logger=[console,jsonl]",
        "trainer.experiment_name=compose_cpu", "trainer.sft.stop_at_accuracy=null"]  # 3 SFT steps: no dev split
ROLE_OF = {"actor-cpu": "actor", "reward": "reward"}


def interpolate(value: str, env: dict) -> str:
    """Compose's ${VAR}, ${VAR:-default} and $$ in one string."""
    def one(m):
        name, default = m.group(1), m.group(3)
        got = env.get(name)
        return got if got else (default or "")
    return re.sub(r"\$\{(\w+)(:-([^}]*))?\}", one, value).replace("$$", "$")


def fixed_port(svc: dict) -> int:
    """The port a compose service's command binds (`--port N`)."""
    argv = svc["command"]
    return int(argv[argv.index("--port") + 1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Localise:
    """The only differences between a container and a local process (see the module doc)."""

    def __init__(self, runs: pathlib.Path, ports: dict[int, int], env: dict):
        self.runs, self.ports, self.env = runs, ports, env

    def __call__(self, value) -> str:
        value = interpolate(str(value), self.env)
        if value == "/runs" or value.startswith(("/runs/", "trainer.default_local_dir=/runs")):
            value = value.replace("/runs", str(self.runs), 1)
        if value == "0.0.0.0":
            return "127.0.0.1"
        if value.isdigit() and int(value) in self.ports:
            return str(self.ports[int(value)])
        m = re.fullmatch(r"127\.0\.0\.1:(\d+)", value)
        return f"127.0.0.1:{self.ports[int(m.group(1))]}" if m and int(m.group(1)) in self.ports else value

    def command(self, svc: dict) -> list[str]:
        return [sys.executable if i == 0 and a == "python" else self(a) for i, a in enumerate(svc["command"])]

    def environment(self, svc: dict) -> dict:
        return dict(os.environ, **{k: self(v) for k, v in svc.get("environment", {}).items()})


def wait_healthy(name: str, svc: dict, local: Localise, proc: subprocess.Popen, log: pathlib.Path, timeout_s=300):
    test = svc["healthcheck"]["test"]
    assert test[0] == "CMD"
    check = local.command({"command": test[1:]})
    deadline = time.monotonic() + timeout_s
    while subprocess.run(check, capture_output=True, env=local.environment({})).returncode != 0:
        assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{name} not healthy after {timeout_s}s:\n{log.read_text()[-3000:]}"
        time.sleep(1.0)


def test_cpu_profile_commands_run_the_builtin_task(tmp_path):
    doc = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    profile = {name: svc for name, svc in doc["services"].items() if "cpu" in svc.get("profiles", [])}
    assert sorted(profile) == ["actor-cpu", "controller", "prepare", "reward"]
    fixed = {name: fixed_port(profile[name]) for name in ROLE_OF}
    local = Localise(tmp_path / "runs", {p: free_port() for p in fixed.values()}, {"TANDEM_OVERRIDES": " ".join(TINY)})
    (tmp_path / "runs").mkdir()
    procs: dict[str, subprocess.Popen] = {}
    try:
        # prepare: a one-shot that every other service depends on (service_completed_successfully)
        assert all(svc["depends_on"]["prepare"]["condition"] == "service_completed_successfully"
                   for name, svc in profile.items() if name != "prepare")
        prep = subprocess.run(local.command(profile["prepare"]), env=local.environment(profile["prepare"]),
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert prep.returncode == 0, prep.stderr[-3000:]
        assert (tmp_path / "runs" / "spec" / "config.yaml").is_file()

        for name in ROLE_OF:  # the services, all started before the first health wait (as compose does)
            log = tmp_path / f"{name}.log"
            with open(log, "wb") as out:
                procs[name] = subprocess.Popen(local.command(profile[name]), env=local.environment(profile[name]),
                                               cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        for name in ROLE_OF:
            wait_healthy(name, profile[name], local, procs[name], tmp_path / f"{name}.log")

        # compose DNS `<role>:<port>` -> where the local process listens
        endpoints = [f"services.{role}.endpoint=127.0.0.1:{local.ports[fixed[name]]}" for name, role in ROLE_OF.items()]
        ctl = profile["controller"]
        run = subprocess.run(local.command(ctl) + endpoints, env=local.environment(ctl), cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
    finally:
        for proc in procs.values():
            proc.terminate()
        codes = {name: proc.wait(timeout=60) for name, proc in procs.items()}
    assert codes == {"actor-cpu": 0, "reward": 0}, codes  # SIGTERM (docker compose down) stops them gracefully

    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("compose_cpu-")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert isinstance(summary["val_accuracy_final"], float)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "actor/pg_loss" in r] == [1, 2]
    # the services ran the run's calls: each logged RPCs tagged with the controller's run id
    for name in ROLE_OF:
        lines = [json.loads(x) for x in (tmp_path / f"{name}.log").read_text().splitlines() if x.startswith("{")]
        assert any(x.get("run_id") == run_dir.name and x.get("method") for x in lines), name
