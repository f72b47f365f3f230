"""A service as an operator sees it: gRPC reflection lists and describes its services (what grpcurl
uses), and --metrics-port / services.<role>.metrics_port serves Prometheus metrics. The reward
service is started for real (python -m tandem.services.reward): it needs no model."""
import re
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest


@pytest.fixture
def reward_service(tmp_path):
    port_file = tmp_path / "reward.port"
    proc = subprocess.Popen([sys.executable, "-m", "tandem.services.reward", "--port-file", str(port_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not port_file.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "timeout"
        time.sleep(0.1)
    yield f"127.0.0.1:{int(port_file.read_text())}", proc
    proc.terminate()
    out, _ = proc.communicate(timeout=30)


def test_reflection_lists_and_describes_the_service(reward_service):
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    endpoint, _ = reward_service
    with grpc.insecure_channel(endpoint) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        assert {"tandem.v1.RewardService", "grpc.health.v1.Health",
                "grpc.reflection.v1alpha.ServerReflection"} <= services, services
        pool = DescriptorPool(db)
        score = pool.FindServiceByName("tandem.v1.RewardService").FindMethodByName("Score")
        assert score.input_type.full_name == "tandem.v1.ScoreRequest"
        assert "batch" in score.input_type.fields_by_name  # the message itself comes over the wire


@pytest.mark.parametrize("how", ["flag", "config key"])
def test_metrics_are_scraped_while_serving(tmp_path, how):
    port_file = tmp_path / "reward.port"
    metrics_port = _free_port()
    setting = ["--metrics-port", str(metrics_port)] if how == "flag" else [f"services.reward.metrics_port={metrics_port}"]
    proc = subprocess.Popen([sys.executable, "-m", "tandem.services.reward", "--port-file", str(port_file), *setting],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        with grpc.insecure_channel(f"127.0.0.1:{int(port_file.read_text())}") as channel:
            score = channel.unary_unary("/tandem.v1.RewardService/Score")
            with pytest.raises(grpc.RpcError) as e:  # refused, and counted
                score(b"", timeout=30)
            # the flag alone starts a long-lived service holding no run (FAILED_PRECONDITION); a
            # config override configures it at start, and the empty request is INVALID_ARGUMENT
            want = grpc.StatusCode.FAILED_PRECONDITION if how == "flag" else grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.code() == want
        counted = re.compile(rf'tandem_rpc_total\{{(?=[^}}]*code="{want.name}")(?=[^}}]*Score)[^}}]*role="reward"'
                             r'[^}]*\} 1\.0')
        deadline = time.monotonic() + 20  # the interceptor counts the call after its answer is sent
        while True:
            body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
            if counted.search(body) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert counted.search(body), body[-1500:]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
