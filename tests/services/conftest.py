"""Real service processes for the service tests, started once per session
(tests/helpers/service_procs.py): actor (colocated: it also serves RolloutService; two DP
ranks), reward, critic and two standalone rollouts (`rollout`, `rollout-1`: replicas), by the
controller's local launcher, as `tandem run` starts them; the critic's trunk is loaded from the actor's
policy, as a run's warm start does. The standalone rollouts pull their weights from the actor
(tandem/weights/)."""
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
import pytest
import torch
from rpc_expect import expect_error  # tests/helpers

from tandem.data.batch import DataProto

SEQ_KEYS = ["input_ids", "attention_mask", "responses", "response_mask"]
PROMPT_TEXTS = ["12+7=", "905+88=", "3+4=", "640+521="]


@dataclass
class Services:
    cfg: object
    run_dir: str
    run_id: str
    endpoints: dict
    tokenizer: object
    vocab_size: int
    pids: dict  # role -> pid of the service's rank 0
    critic_before_load: object = None  # the critic's answer to a save before the policy's trunk was loaded

    def client(self, kind: str, role: str | None = None):
        """A controller client for `kind` at `role`'s endpoint (create inside the event loop)."""
        from tandem.controller.clients import (
            ActorClient,
            CriticClient,
            RewardClient,
            RolloutClient,
        )
        from tandem.controller.roles import security

        cls = {"actor": ActorClient, "rollout": RolloutClient, "critic": CriticClient, "reward": RewardClient}[kind]
        return cls(self.endpoints[role or kind], timeout_s=120, metadata={"x-run-id": self.run_id},
                   security=security(self.cfg, role or kind))

    def source(self) -> str:
        """The actor's endpoint: where the standalone rollouts pull weights from."""
        return self.endpoints["actor"]

    def prompts(self, texts=PROMPT_TEXTS) -> DataProto:
        from tandem.generation.engine import left_pad

        tok = self.tokenizer
        rows = [[tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        ids, mask = left_pad(rows, tok.pad_token_id)
        return DataProto(tensors={"input_ids": ids, "attention_mask": mask})


@contextmanager
def launched(base, overrides: list[str]):
    """All four roles as real processes from one run's config (+ `overrides`): actor (colocated
    rollout), reward, critic and a standalone rollout, started in parallel by the controller's
    local launcher (tests/helpers/service_procs.py) -> Services; every process stopped afterwards."""
    from service_procs import start_services, stop_services
    from transformers import AutoTokenizer

    from tandem.models.shape_from_config import padded_vocab_size

    started = start_services(str(base), "service_tests", overrides)
    try:
        cfg = started.cfg
        tok = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path)
        yield Services(cfg, started.run_dir, started.run_id, started.endpoints, tok, padded_vocab_size(len(tok)),
                       started.pids, started.critic_before_load)
    finally:
        stop_services(started.launchers)
    for launcher in started.launchers:
        for role, proc in launcher.processes.items():
            assert proc.returncode is not None, f"{role} service still running"


@pytest.fixture(scope="session")
def services(tmp_path_factory):
    # the actor as two DP ranks: bad input must leave every rank intact
    with launched(tmp_path_factory.mktemp("service_runs"), ["services.actor.world_size=2"]) as running:
        yield running


# ---- helpers ------------------------------------------------------------------------------

async def raw_call(endpoint: str, method: str, payload: bytes) -> grpc.aio.AioRpcError:
    """Send raw bytes to a method (no serializer); return the error it must answer with."""
    async with grpc.aio.insecure_channel(endpoint) as ch:
        call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            await call(payload, timeout=60)
        except grpc.aio.AioRpcError as e:
            return e
    raise AssertionError(f"{method} accepted garbage bytes")


def garbage(seed: int = 0, size: int = 200) -> bytes:
    """Bytes that are not a protobuf message: tag 0x07 is field 0 with wire type 7 (invalid)."""
    g = torch.Generator().manual_seed(seed)
    return b"\x07" + bytes(torch.randint(0, 256, (size,), generator=g, dtype=torch.uint8).tolist())


def sequences(gen: DataProto) -> DataProto:
    """The generated rows as the actor/critic take them (what controller.step sends)."""
    seq = gen.select(tensor_keys=SEQ_KEYS)
    seq.meta = {"temperature": gen.meta["temperature"], "rollout_n": int(gen.meta["rollout_n"])}
    return seq


def with_tensor(batch: DataProto, name: str, value) -> DataProto:
    out = DataProto(tensors=dict(batch.tensors), columns=dict(batch.columns), meta=dict(batch.meta))
    if value is None:
        out.tensors.pop(name)
    else:
        out.tensors[name] = value
    return out


# test modules reach the helpers through the fixture (tests/ has no packages to import from)
for _f in (expect_error, raw_call, garbage, sequences, with_tensor):
    setattr(Services, _f.__name__, staticmethod(_f))
