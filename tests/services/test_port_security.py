"""Every service port locked: TLS with a server certificate (mutual TLS on the critic), a bearer
token per endpoint (from a file or an environment variable), health checks open without a token
only where configured (the reward). For each role, one parametrised test: no token and a wrong
token are UNAUTHENTICATED, a plaintext call to the TLS port fails, and an authorised call works.
Certificates are made at test time (tests/helpers/certs.py)."""
import asyncio
import os
import pathlib

import grpc
import pytest
from certs import make_certs, tls_overrides
from conftest import launched
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.rpc.security import EndpointSecurity
from tandem.rpc.tls import TLSFiles
from tandem.v1 import actor_pb2, critic_pb2, reward_pb2, rollout_pb2

ROLES = ["actor", "rollout", "critic", "reward"]
TOKEN_ENV = "TANDEM_TEST_ACTOR_TOKEN"
# a method of each role's service, called with an empty request (rejected before it is parsed)
METHODS = {"actor": ("/tandem.v1.ActorService/ComputeLogProb", actor_pb2.ComputeLogProbRequest),
           "rollout": ("/tandem.v1.RolloutService/GenerateSequences", rollout_pb2.GenerateSequencesRequest),
           "critic": ("/tandem.v1.CriticService/ComputeValues", critic_pb2.ComputeValuesRequest),
           "reward": ("/tandem.v1.RewardService/Score", reward_pb2.ScoreRequest)}


@pytest.fixture(scope="module")
def locked(tmp_path_factory):
    d = tmp_path_factory.mktemp("locked")
    certs = make_certs(d / "certs")
    tokens = {role: f"secret-{role}-{os.urandom(8).hex()}" for role in ROLES}
    overrides = []
    for role in ROLES:
        overrides += tls_overrides(role, certs, mutual=role == "critic")
        if role == "actor":  # from an environment variable; the others from files
            os.environ[TOKEN_ENV] = tokens[role]
            overrides.append(f"services.{role}.auth.token_env={TOKEN_ENV}")
        else:
            (d / f"{role}.token").write_text(tokens[role] + "\n")
            overrides.append(f"services.{role}.auth.token_file={d / f'{role}.token'}")
    overrides.append("services.reward.auth.health_without_token=true")
    try:
        with launched(d / "runs", overrides) as running:
            yield running, certs, tokens
    finally:
        os.environ.pop(TOKEN_ENV, None)


async def _call(endpoint: str, method: str, request, security: EndpointSecurity) -> tuple[grpc.StatusCode, str]:
    from tandem.rpc.client import make_channel

    async with make_channel(endpoint, security=security) as channel:
        call = channel.unary_unary(method, request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=lambda b: b)
        try:
            await call(request, timeout=20)
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details()
    return grpc.StatusCode.OK, ""


async def _health(endpoint: str, security: EndpointSecurity):
    from tandem.rpc.client import make_channel

    async with make_channel(endpoint, security=security) as channel:
        try:
            r = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=20)
            return grpc.StatusCode.OK, r.status
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details()


async def _authorised_call(services, role: str) -> None:
    """A real call of the role's service through the controller's own client."""
    rollout = services.client("rollout")
    try:
        if role == "reward":
            from tandem.data.batch import DataProto

            async with services.client("reward") as reward:
                assert await reward.score(DataProto(columns={"response_text": ["19", "5"],
                                                             "ground_truth": ["19", "7"]})) == [1.0, 0.0]
            return
        gen = await rollout.generate_sequences(services.prompts(), max_new_tokens=3, greedy=True)
        assert gen["responses"].shape == (4, 3)
        if role == "actor":
            async with services.client("actor") as actor:
                assert (await actor.compute_log_prob(services.sequences(gen)))[0]["old_log_probs"].shape == (4, 3)
        if role == "critic":
            async with services.client("critic") as critic:
                assert (await critic.compute_values(services.sequences(gen)))["values"].shape == (4, 3)
    finally:
        await rollout.close()


@pytest.mark.parametrize("role", ROLES)
def test_port_is_locked(locked, role):
    services, certs, tokens = locked
    endpoint = services.endpoints[role]
    method, request_cls = METHODS[role]
    tls = TLSFiles(ca_file=certs.ca, client_auth=role == "critic",
                   client_cert_file=certs.client_cert if role == "critic" else None,
                   client_key_file=certs.client_key if role == "critic" else None)
    no_token = EndpointSecurity(tls=tls)
    wrong = EndpointSecurity(tls=tls, token=tokens["reward" if role != "reward" else "actor"])
    right = EndpointSecurity(tls=tls, token=tokens[role])
    plaintext = EndpointSecurity(token=tokens[role])

    async def main():
        code, details = await _call(endpoint, method, request_cls(), no_token)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "missing bearer token" in details
        code, details = await _call(endpoint, method, request_cls(), wrong)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "invalid bearer token" in details
        assert tokens[role] not in details
        code, _ = await _call(endpoint, method, request_cls(), plaintext)
        assert code == grpc.StatusCode.UNAVAILABLE  # no TLS handshake: the call never reaches the service
        # the token reaches the servicer: an empty request is now a parse/validation error, not UNAUTHENTICATED
        code, _ = await _call(endpoint, method, request_cls(), right)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        # health: with the token always; without only where configured (the reward)
        assert await _health(endpoint, right) == (grpc.StatusCode.OK, health_pb2.HealthCheckResponse.SERVING)
        code, _ = await _health(endpoint, no_token)
        assert code == (grpc.StatusCode.OK if role == "reward" else grpc.StatusCode.UNAUTHENTICATED)
        if role == "critic":  # mutual TLS: a caller without a client certificate, or with a stranger's, fails
            for bad_tls in (TLSFiles(ca_file=certs.ca),
                            TLSFiles(ca_file=certs.ca, client_auth=True, client_cert_file=certs.other_client_cert,
                                     client_key_file=certs.other_client_key)):
                code, _ = await _call(endpoint, method, request_cls(), EndpointSecurity(tls=bad_tls, token=tokens[role]))
                assert code == grpc.StatusCode.UNAVAILABLE
        # a client that trusts another CA refuses the service's certificate
        code, _ = await _call(endpoint, method, request_cls(), EndpointSecurity(
            tls=TLSFiles(ca_file=certs.other_ca), token=tokens[role]))
        assert code == grpc.StatusCode.UNAVAILABLE
        await _authorised_call(services, role)

    asyncio.run(main())


def test_tokens_are_never_logged(locked):
    services, _, tokens = locked
    logs = "".join(p.read_text(errors="replace") for p in pathlib.Path(services.run_dir, "logs").glob("*.log"))
    assert '"token": true' in logs  # control: the services did log their security settings
    for token in tokens.values():
        assert token not in logs
    with open(os.path.join(services.run_dir, "config.yaml")) as f:
        assert not any(token in f.read() for token in tokens.values())
