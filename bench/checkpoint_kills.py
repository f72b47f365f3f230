"""kill -9 at random moments of checkpoint saves; then the latest checkpoint must load (issue 21).

Starts an actor (two ranks) and a critic service as `tandem run` does, and a saver process
that plays the controller: it writes run checkpoints back to back with the controller's own
code (controller/checkpointing.py: the actor's and the critic's dist-checkpoint directories,
then controller_state.json). At a random moment it SIGKILLs one of: the saver (the controller
dies mid-save), the actor's rank 0, the actor's rank 1, or the critic, then stops the saver,
restarts what died (the local launcher's restart, as crash recovery does), and checks that
`checkpointing.latest` picks a complete checkpoint and that the actor and critic load it
(LoadCheckpoint) with its controller_state.json naming its step. Prints where the kills landed
(which part of a save was being written), the checkpoints examined and the number of
unloadable latest checkpoints.

    python bench/checkpoint_kills.py            # 50 kills (about 15 minutes on 2 CPU cores)
    python bench/checkpoint_kills.py --kills 8
"""
from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "helpers")]  # run from anywhere; service_procs
TARGETS = ("saver", "actor", "actor rank 1", "critic")
OVERRIDES = ["algorithm.adv_estimator=gae", "services.actor.world_size=2"]


# ---- the saver (the controller's side of a save), run as its own process --------------------

async def saver(run_dir: str, actor: str, critic: str, progress: str) -> None:
    from tandem.controller import checkpointing
    from tandem.controller.clients import ActorClient, CriticClient

    class Roles:  # what checkpointing.save uses of controller.roles.Roles
        def __init__(self):
            self.actor, self.critic = ActorClient(actor, timeout_s=120), CriticClient(critic, timeout_s=120)

    roles = Roles()
    last = checkpointing.latest(run_dir)
    step = checkpointing.read_state(last)["global_step"] + 1 if last else 1
    while True:
        with open(progress, "a") as f:
            f.write(f"{step}\n")
        await checkpointing.save(roles, run_dir, {"global_step": step, "bench": "checkpoint_kills"})
        step += 1


# ---- the bench ------------------------------------------------------------------------------

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--saver", nargs=4, metavar=("RUN_DIR", "ACTOR", "CRITIC", "PROGRESS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.saver:
        asyncio.run(saver(*args.saver))
        return 0

    from service_procs import start_services, stop_services

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs", flush=True)
    tmp = tempfile.mkdtemp(prefix="tandem-kills-")
    started = start_services(tmp, "kills", OVERRIDES, roles=("actor", "critic"))
    try:
        result = KillBench(started, random.Random(args.seed)).run(args.kills)
    finally:
        stop_services(started.launchers)
    shutil.rmtree(tmp, ignore_errors=True)
    return result


class KillBench:
    def __init__(self, started, rng: random.Random):
        self.started, self.rng = started, rng
        self.launcher = started.launchers[0]
        self.run_dir = started.run_dir
        self.progress = os.path.join(self.run_dir, "saver.progress")
        self.landed: Counter = Counter()  # what was being written when the kill came
        self.by_target: Counter = Counter()
        self.unloadable: list[str] = []
        self.examined = 0
        self.none_yet = 0

    def run(self, kills: int) -> int:
        save_s = self.measure_save_seconds()
        print(f"one save (actor + critic + controller state): {save_s:.2f} s; killing within [0, {3 * save_s:.1f}] s "
              "of the saver's start", flush=True)
        for i in range(kills):
            target = TARGETS[i % len(TARGETS)]
            self.kill_during_saves(target, self.rng.uniform(0.0, 3 * save_s))
            self.check_latest()
            print(f"kill {i + 1}/{kills}: {target}, latest {os.path.basename(self.latest() or '-')}, "
                  f"unloadable so far {len(self.unloadable)}", flush=True)
        print(f"\n{kills} kills during checkpoint saves: " + ", ".join(f"{t} {n}" for t, n in self.by_target.items()))
        print("what was being written when the kill came: " + ", ".join(f"{k} {n}" for k, n in self.landed.items()))
        print(f"latest checkpoints examined: {self.examined} (no complete checkpoint yet: {self.none_yet})")
        print(f"unloadable latest checkpoints: {len(self.unloadable)}")
        for what in self.unloadable:
            print(f"  {what}")
        return 1 if self.unloadable else 0

    def saver_cmd(self) -> list[str]:
        e = self.started.endpoints
        return [sys.executable, os.path.abspath(__file__), "--saver", self.run_dir, e["actor"], e["critic"],
                self.progress]

    def measure_save_seconds(self, saves: int = 3) -> float:
        """Mean seconds of a whole save, from the saver's own progress lines (after a warm-up save)."""
        proc = subprocess.Popen(self.saver_cmd(), env=dict(os.environ, PYTHONPATH=ROOT))
        while self._saves_started() < saves + 2:
            time.sleep(0.05)
        t0, n0 = time.perf_counter(), self._saves_started()
        while self._saves_started() < n0 + saves:
            time.sleep(0.01)
        proc.kill()
        proc.wait()
        return (time.perf_counter() - t0) / saves

    def _saves_started(self) -> int:
        return len(open(self.progress).read().split()) if os.path.exists(self.progress) else 0

    def kill_during_saves(self, target: str, delay_s: float) -> None:
        proc = subprocess.Popen(self.saver_cmd(), env=dict(os.environ, PYTHONPATH=ROOT))
        n0 = self._saves_started()
        while self._saves_started() == n0:  # the saver's first save has begun
            time.sleep(0.01)
        time.sleep(delay_s)
        self.landed[self.writing_now()] += 1
        if target == "saver":
            proc.kill()
        else:
            role, rank = (target.split(" rank ")[0], int(target.split(" rank ")[1])) if " rank " in target \
                else (target, 0)
            os.kill(self.rank_pid(role, rank), signal.SIGKILL)
            self.wait_exit(role)
        self.by_target[target] += 1
        proc.kill()
        proc.wait()
        for role in ("actor", "critic"):
            if not self.launcher.is_running(role) or not self.answers(role):
                self.restart(role)

    def wait_exit(self, role: str, timeout_s: float = 120) -> None:
        """Until `role`'s rank 0 has exited: at once when it was killed, after noticing its lost
        rank otherwise (on a loaded machine that takes a while; a load sent before would meet a
        dying service, which says nothing about the checkpoint)."""
        deadline = time.monotonic() + timeout_s
        while self.launcher.is_running(role) and time.monotonic() < deadline:
            time.sleep(0.1)

    def writing_now(self) -> str:
        """Which part of the newest step directory is being written (or the gap between saves)."""
        steps = sorted(glob.glob(os.path.join(self.run_dir, "checkpoints", "global_step_*")),
                       key=lambda d: int(d.rsplit("_", 1)[1]))
        if not steps:
            return "actor (first save)"
        d = steps[-1]
        if os.path.exists(os.path.join(d, "controller_state.json")):
            return "between saves / controller_state.json"
        if os.path.exists(os.path.join(d, "critic.tmp")) or os.path.exists(os.path.join(d, "critic")):
            return "critic"
        return "actor"

    def rank_pid(self, role: str, rank: int) -> int:
        pids = {}
        for line in open(os.path.join(self.run_dir, "logs", f"{role}.log"), errors="replace"):
            if '"service.process"' in line:
                event = json.loads(line)
                pids[event["rank"]] = event["pid"]
        return pids[rank]

    def answers(self, role: str) -> bool:
        from tandem.rpc.client import ServiceClient
        from tandem.v1 import actor_pb2_grpc

        async def check() -> bool:
            client = ServiceClient(self.started.endpoints[role], actor_pb2_grpc.ActorServiceStub)
            try:
                await client.wait_healthy(timeout_s=5)
                return True
            except Exception:  # noqa: BLE001 - not answering, whatever the reason
                return False
            finally:
                await client.close()

        time.sleep(0.5)  # a rank-0 exit after a lost rank takes a moment
        return self.launcher.is_running(role) and asyncio.run(check())

    def restart(self, role: str) -> None:
        self.started.endpoints[role] = asyncio.run(self.launcher.restart(role))

    def latest(self) -> str | None:
        from tandem.controller import checkpointing

        return checkpointing.latest(self.run_dir)

    def check_latest(self) -> None:
        """The latest complete checkpoint loads in the actor and the critic and names its own step."""
        from tandem.controller import checkpointing
        from tandem.controller.clients import ActorClient, CriticClient

        ckpt = self.latest()
        if ckpt is None:
            self.none_yet += 1
            return
        self.examined += 1

        async def load() -> None:
            actor = ActorClient(self.started.endpoints["actor"], timeout_s=120)
            critic = CriticClient(self.started.endpoints["critic"], timeout_s=120)
            try:
                await actor.load_checkpoint(os.path.join(ckpt, "actor"))
                await critic.load_checkpoint(os.path.join(ckpt, "critic"))
            finally:
                await actor.close()
                await critic.close()

        try:
            step = checkpointing.read_state(ckpt)["global_step"]
            if f"global_step_{step}" != os.path.basename(ckpt):
                raise ValueError(f"controller_state.json says step {step}")
            asyncio.run(load())
        except Exception as e:  # noqa: BLE001 - any failure to load is what this bench counts
            self.unloadable.append(f"{ckpt}: {type(e).__name__}: {e}")
        for old in glob.glob(os.path.join(self.run_dir, "checkpoints", "global_step_*")):
            if old != ckpt and int(old.rsplit("_", 1)[1]) < int(ckpt.rsplit("_", 1)[1]):
                shutil.rmtree(old, ignore_errors=True)  # disk: keep the latest (and newer, incomplete ones)


if __name__ == "__main__":
    sys.exit(main())
