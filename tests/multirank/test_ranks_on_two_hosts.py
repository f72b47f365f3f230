"""A two-rank service started by hand on two "hosts" forms its group over TCP (no shared file).

Two network namespaces joined by a veth pair stand for two hosts (10.231.0.1 and 10.231.0.2):
rank 0 of a standalone rollout service (DP=2) starts in the first with `--rank 0`, rank 1 in the
second with `--rank 1`, both given MASTER_ADDR/MASTER_PORT = rank 0's address and a port, and
GLOO_SOCKET_IFNAME = their host's interface. Rank 0 serves only once the group has formed; a
client in the second namespace then checks its health and generates through it (the prompts are
split over both ranks). The only path between the two ranks is the veth pair, so the
rendezvous and gloo's connections went over TCP between the "hosts".

Where network namespaces cannot be created (not root, no CAP_SYS_ADMIN), the two hosts are the
loopback addresses 127.0.0.2 (rank 0, and the rendezvous) and 127.0.0.3 (the client); gloo then
uses the loopback interface for both ranks.
"""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ["data.builtin_train_size=20", "data.builtin_val_size=8", "actor_rollout_ref.rollout.mode=standalone",
        "services.rollout.world_size=2", "data.max_response_length=4"]


def _ip(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


class Hosts:
    """Two "hosts": `run(i, argv)` prefixes argv to run on host i; `addr[i]`, `ifname[i]`."""

    def __init__(self):
        tag = uuid.uuid4().hex[:6]
        self.ns = [f"tdA{tag}", f"tdB{tag}"]
        self.ifname = [f"tva{tag}", f"tvb{tag}"]
        self.addr = ["10.231.0.1", "10.231.0.2"]
        self.isolated = self._make()
        self.master_port = 29611  # any: a fresh namespace has every port free
        if not self.isolated:
            self.addr, self.ifname = ["127.0.0.2", "127.0.0.3"], ["lo", "lo"]
            with socket.socket() as s:
                s.bind((self.addr[0], 0))
                self.master_port = s.getsockname()[1]

    def _make(self) -> bool:
        if os.geteuid() != 0 or _ip("netns", "add", self.ns[0]).returncode != 0:
            return False
        steps = [("netns", "add", self.ns[1]),
                 ("link", "add", self.ifname[0], "type", "veth", "peer", "name", self.ifname[1])]
        for i in (0, 1):
            steps += [("link", "set", self.ifname[i], "netns", self.ns[i]),
                      ("-n", self.ns[i], "addr", "add", f"{self.addr[i]}/24", "dev", self.ifname[i]),
                      ("-n", self.ns[i], "link", "set", self.ifname[i], "up"),
                      ("-n", self.ns[i], "link", "set", "lo", "up")]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                self.close()
                pytest.fail(f"ip {' '.join(step)}: {done.stderr}")
        return True

    def run(self, i: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[i], *argv] if self.isolated else argv

    def close(self) -> None:
        for ns in self.ns:
            _ip("netns", "del", ns)  # takes its end of the veth pair with it


@pytest.fixture
def hosts():
    h = Hosts()
    yield h
    if h.isolated:
        h.close()


def test_two_rank_service_over_tcp_between_hosts(hosts, tmp_path):
    from tandem.config import load_config
    from tandem.controller.launchers.commands import service_argv, service_env
    from tandem.controller.run_dir import materialise

    spec = tmp_path / "spec"
    spec.mkdir()
    materialise(load_config(None, TINY), str(spec))
    config = str(spec / "config.yaml")
    port_file = tmp_path / "rollout.port"
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    procs = []
    try:
        for rank in (0, 1):
            argv = service_argv("rollout", config, host=hosts.addr[0], port_file=str(port_file) if rank == 0 else None,
                                rank=rank, insecure=True)  # a test network of its own: no token
            env = dict(os.environ, **service_env(master=(hosts.addr[0], hosts.master_port)),
                       GLOO_SOCKET_IFNAME=hosts.ifname[rank])
            with open(logs[rank], "wb") as out:
                procs.append(subprocess.Popen(hosts.run(rank, argv), env=env, cwd=ROOT, stdout=out,
                                              stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 300
        while not port_file.exists():  # written once SERVING, which needs the group formed
            for rank, proc in enumerate(procs):
                assert proc.poll() is None, f"rank {rank} exited {proc.returncode}:\n{logs[rank].read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no group after 300 s:\n" + logs[1].read_text()[-3000:]
            time.sleep(0.5)
        endpoint = f"{hosts.addr[0]}:{int(port_file.read_text())}"

        # from the other host: health, then a generation split over both ranks
        health = subprocess.run(hosts.run(1, [sys.executable, "-m", "tandem.rpc.healthcheck", endpoint]),
                                capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert health.returncode == 0, health.stderr
        client = [sys.executable, str(ROOT / "tests" / "helpers" / "generate_client.py"), endpoint, config]
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # the helper imports the controller
        gen = subprocess.run(hosts.run(1, client), capture_output=True, text=True, cwd=ROOT, timeout=300,
                             env=dict(os.environ, PYTHONPATH=path))
        assert gen.returncode == 0, gen.stderr[-3000:]
        assert json.loads(gen.stdout.splitlines()[-1])["rows"] == 4
    finally:
        for proc in procs[:1]:  # rank 0 releases rank 1 when it stops
            proc.terminate()
        codes = [proc.wait(timeout=60) for proc in procs]
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]

    events = [[json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")] for log in logs]
    for rank in (0, 1):
        (rdzv,) = [e for e in events[rank] if e["event"] == "service.rendezvous"]
        assert (rdzv["rank"], rdzv["master_addr"], rdzv["master_port"]) == (rank, hosts.addr[0], hosts.master_port)
    # rank 0 served on its host's address (and answered only with both ranks' shares of the prompts)
    assert any(e["event"] == "server.serving" and e["host"] == hosts.addr[0] for e in events[0])
