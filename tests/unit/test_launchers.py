"""Launchers: the registry and `trainer.launcher`, the one command source, Ray placement, the compose
launcher's wait and its errors, and the grpc health-check entry point.

Real gRPC servers in-process (a grpc.health.v1 servicer) stand in for a service's health endpoint;
starting real services through each launcher is tests/e2e (test_compose_processes.py, test_ray_launcher.py).
"""
import asyncio
import socket
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tandem.config import ConfigError, load_config
from tandem.config.checks import placement as placement_checks
from tandem.controller.launchers import LAUNCHERS, LaunchContext, Launcher, commands, get_launcher
from tandem.controller.launchers.compose import ComposeLauncher, compose_address
from tandem.controller.launchers.ray import placement
from tandem.controller.launchers.start_failure import ServiceStartFailed
from tandem.logging import get_logger
from tandem.rpc import healthcheck


def error_of(*overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, list(overrides))
    return str(e.value)


def test_config_knows_exactly_the_registered_launchers():
    assert tuple(LAUNCHERS) == placement_checks.LAUNCHERS
    for name in LAUNCHERS:
        assert issubclass(get_launcher(name), Launcher)
        assert load_config(None, [f"trainer.launcher={name}"]).trainer.launcher == name
    assert load_config(None, []).trainer.launcher == "local"


def test_bad_launcher_host_and_placement_are_config_errors_naming_the_key():
    assert error_of("trainer.launcher=k8s") == "trainer.launcher: unknown launcher 'k8s'; known: local, compose, ray"
    assert error_of("services.actor.host=10.0.0.1:50051").startswith("services.actor.host: '10.0.0.1:50051' must be")
    assert error_of("services.reward.host=a b").startswith("services.reward.host: 'a b' must be")
    assert error_of("services.critic.ray.strategy=ANYWHERE").startswith("services.critic.ray.strategy: 'ANYWHERE'")
    assert error_of("services.rollout.ray.num_gpus=-1") == "services.rollout.ray.num_gpus: -1.0 must be >= 0"
    assert error_of("services.actor.ray.resources={node_a: -2}").startswith("services.actor.ray.resources:")
    for ok in ("0.0.0.0", "node-3.cluster", "fe80::1"):
        assert load_config(None, [f"services.actor.host='{ok}'"]).services.actor.host == ok


def test_service_command_is_one_place():
    argv = commands.service_argv("critic", "/r/config.yaml", host="0.0.0.0", port=50053, run_id="r1",
                                 python="python")
    assert argv == ["python", "-m", "tandem.services.critic", "--config", "/r/config.yaml", "--host", "0.0.0.0",
                    "--port", "50053", "--run-id", "r1"]
    ranked = commands.service_argv("actor", "c.yaml", host="h", port_file="p", rank=1, python="py")
    assert ranked[-4:] == ["--port-file", "p", "--rank", "1"]
    with pytest.raises(ValueError, match="unknown role 'judge'"):
        commands.service_argv("judge", "c.yaml", host="h")
    env = commands.service_env(master=("10.1.2.3", 29500), local_rank=0, node_id="abc")
    assert env == {**commands.BASE_ENV, "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500", "LOCAL_RANK": "0",
                   "TANDEM_NODE_ID": "abc"}
    assert commands.connect_host("0.0.0.0") == "127.0.0.1" and commands.connect_host("10.0.0.5") == "10.0.0.5"


def test_ray_placement_one_bundle_per_rank_strict_pack_for_tensor_parallel():
    cfg = load_config(None, ["services.actor.world_size=2",
                             "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                             "services.actor.ray.num_gpus=1", "services.actor.ray.num_cpus=4",
                             "services.reward.ray.resources={node_b: 0.5}", "services.critic.world_size=2",
                             "critic.ppo_mini_batch_size=2"])
    assert placement(cfg, "actor") == ([{"CPU": 4.0, "GPU": 1.0}] * 2, "STRICT_PACK")
    assert placement(cfg, "critic") == ([{"CPU": 1.0}] * 2, "SPREAD")  # DP only: ranks may spread over nodes
    assert placement(cfg, "reward") == ([{"CPU": 1.0, "node_b": 0.5}], "SPREAD")
    cfg = load_config(None, ["services.critic.ray.strategy=PACK"])
    assert placement(cfg, "critic")[1] == "PACK"


@pytest.fixture
def health_server():
    """A real gRPC server answering grpc.health.v1 (SERVING) on 127.0.0.1 -> its port."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port, servicer
    server.stop(0)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_healthcheck_entry_point(health_server, capsys):
    port, servicer = health_server
    assert healthcheck.main([f"127.0.0.1:{port}"]) == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert healthcheck.main([f"127.0.0.1:{port}"]) == 1
    assert f"127.0.0.1:{port}: NOT_SERVING" in capsys.readouterr().err
    assert healthcheck.main([f"127.0.0.1:{closed_port()}", "--timeout", "1"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err


def test_compose_launcher_waits_for_named_services_and_names_the_missing_one(health_server, tmp_path):
    port, _ = health_server
    ctx = LaunchContext(str(tmp_path / "config.yaml"), str(tmp_path), "r1", startup_timeout_s=2.0)
    assert compose_address("critic") == f"critic:{commands.PORTS['critic']}"
    dead = closed_port()
    launcher = ComposeLauncher(ctx, address=lambda role: f"127.0.0.1:{port if role == 'reward' else dead}")
    assert asyncio.run(launcher.start(["reward"])) == {"reward": f"127.0.0.1:{port}"}
    with pytest.raises(TimeoutError) as e:
        asyncio.run(launcher.start(["reward", "critic"]))
    assert str(e.value).startswith(f"the critic service is not serving at 127.0.0.1:{dead} after 2s")
    assert "profile gpu-ppo or cpu-ppo" in str(e.value) and "reward" not in str(e.value)
    launcher.stop()  # compose owns the containers: nothing to stop, twice is fine
    launcher.stop()
    # restart: compose's restart policy starts the container; the launcher waits for it at its address
    assert asyncio.run(launcher.restart("reward")) == f"127.0.0.1:{port}"
    with pytest.raises(ServiceStartFailed) as e:
        asyncio.run(launcher.restart("critic"))
    assert str(e.value).startswith(f"the critic service did not come back at 127.0.0.1:{dead} within "
                                   "services.startup_timeout_s=2 (compose restarts its container when it exits")
    # a container that `docker kill` stopped is not restarted by Docker: the wait and the error say what to run
    assert "not restarted: `docker compose start SERVICE` brings it back (SERVICE: critic, or critic-cpu" in str(e.value)
    with pytest.raises(NotImplementedError, match=r"cannot stop a hung service .*`docker compose restart actor`"):
        asyncio.run(launcher.restart("actor", hung=True))  # compose restarts only what exits


def test_prepare_writes_the_spec_and_refuses_bad_keys(tmp_path, capsys, monkeypatch):
    from tandem.controller import prepare

    spec = tmp_path / "spec"
    assert prepare.main([str(spec), "trainer.launcher=k8s"]) == 2
    assert "trainer.launcher: unknown launcher 'k8s'" in capsys.readouterr().err
    assert not spec.exists()  # nothing written for a bad config
    monkeypatch.setenv("TANDEM_OVERRIDES", "data.builtin_val_size=8 trainer.launcher=compose")
    assert prepare.main([str(spec), "data.builtin_train_size=20"]) == 0
    cfg = load_config(str(spec / "config.yaml"))
    assert cfg.trainer.launcher == "compose" and cfg.data.builtin_train_size == 20
    assert cfg.actor_rollout_ref.model.tokenizer_path == str(spec / "tokenizer")
    assert cfg.data.train_files.startswith(str(spec / "data")) and (spec / "tokenizer").is_dir()


def test_a_separately_started_rank_needs_its_rendezvous(monkeypatch):
    from tandem.serving import process

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    args = process.parse_args("rollout", ["--rank", "1"])
    assert args.host == "127.0.0.1" and (args.master_addr, args.master_port) == (None, None)
    log = get_logger("test")
    with pytest.raises(ValueError, match="rollout rank 1 of 2: the rendezvous is not set; give --master-addr"):
        process._rendezvous("rollout", args, 2, log)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    monkeypatch.setenv("MASTER_PORT", "29500")
    args = process.parse_args("rollout", ["--rank", "2", "--host", "0.0.0.0", "services.rollout.host=10.0.0.8"])
    assert (args.host, args.master_addr, args.master_port) == ("0.0.0.0", "10.0.0.7", 29500)
    with pytest.raises(ValueError, match=r"--rank 2 is outside services.rollout.world_size=2"):
        process._rendezvous("rollout", args, 2, log)
    assert process.parse_args("rollout", ["--insecure", "services.rollout.host=10.0.0.8"]).host == "10.0.0.8"
    with pytest.raises(SystemExit):  # rank 0 beyond loopback without a token (test_control_plane_security.py)
        process.parse_args("rollout", ["services.rollout.host=10.0.0.8"])
