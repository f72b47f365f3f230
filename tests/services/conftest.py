"""Real service processes for the service tests, started once per session.

actor (colocated: it also serves RolloutService), reward, critic from the run's
config.yaml, and a standalone rollout from a copy with rollout.mode=standalone, all
started together (one process each) by the controller's local launcher, as `tandem run` does.
"""
import asyncio
import os
from contextlib import contextmanager
from dataclasses import dataclass, replace

import grpc
import pytest
import torch

from tandem.data.batch import DataProto
from tandem.rpc.errors import TandemError

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

    def client(self, kind: str, role: str | None = None):
        """A controller client for `kind` at `role`'s endpoint (create inside the event loop)."""
        from controller.clients import (
            ActorClient,
            CriticClient,
            RewardClient,
            RolloutClient,
        )
        from controller.roles import security

        cls = {"actor": ActorClient, "rollout": RolloutClient, "critic": CriticClient, "reward": RewardClient}[kind]
        return cls(self.endpoints[role or kind], timeout_s=120, metadata={"x-run-id": self.run_id},
                   security=security(self.cfg, role or kind))

    def prompts(self, texts=PROMPT_TEXTS) -> DataProto:
        from tandem.generation.engine import left_pad

        tok = self.tokenizer
        rows = [[tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        ids, mask = left_pad(rows, tok.pad_token_id)
        return DataProto(tensors={"input_ids": ids, "attention_mask": mask})


SERVICE_TEST_CONFIG = [
    "trainer.experiment_name=service_tests",
    "data.builtin_train_size=200", "data.builtin_val_size=16", "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_mini_batch_size=4",
    "actor_rollout_ref.model.init_std=0.3", "actor_rollout_ref.rollout.mode=colocated",
    "actor_rollout_ref.actor.ppo_epochs=1", "actor_rollout_ref.actor.shuffle=false",
    "actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false",
    "services.actor.torch_threads=1"]


@contextmanager
def launched(base, overrides: list[str]):
    """All four roles as real processes from one run's config (+ `overrides`): actor (colocated
    rollout), reward and critic from config.yaml, a standalone rollout from a copy with
    rollout.mode=standalone, started in parallel by the controller's local launcher -> Services;
    every process stopped afterwards."""
    from transformers import AutoTokenizer

    from controller.launchers import LaunchContext
    from controller.launchers.local import LocalLauncher
    from controller.run_dir import create_run_dir
    from tandem.config import load_config, to_yaml
    from tandem.models.shape_from_config import padded_vocab_size

    cfg = load_config(None, [f"trainer.default_local_dir={base}", *SERVICE_TEST_CONFIG, *overrides])
    cfg, run_dir = create_run_dir(cfg)
    run_id = os.path.basename(run_dir)
    standalone = replace(cfg, actor_rollout_ref=replace(
        cfg.actor_rollout_ref, rollout=replace(cfg.actor_rollout_ref.rollout, mode="standalone")))
    standalone_yaml = os.path.join(run_dir, "config_standalone.yaml")
    with open(standalone_yaml, "w") as f:
        f.write(to_yaml(standalone))

    # two launchers (two config files); all four services start in parallel
    launchers = [LocalLauncher(LaunchContext(path, run_dir, run_id, startup_timeout_s=180))
                 for path in (os.path.join(run_dir, "config.yaml"), standalone_yaml)]

    async def start() -> dict:
        main, standalone = await asyncio.gather(launchers[0].start(["actor", "reward", "critic"]),
                                                launchers[1].start(["rollout"]))
        return {**main, **standalone}

    try:
        endpoints = asyncio.run(start())
        tok = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path)
        yield Services(cfg, run_dir, run_id, endpoints, tok, padded_vocab_size(len(tok)))
    finally:
        for launcher in launchers:
            launcher.stop()
    for launcher in launchers:
        for role, proc in launcher.processes.items():
            assert proc.returncode is not None, f"{role} service still running"


@pytest.fixture(scope="session")
def services(tmp_path_factory):
    # the actor as two DP ranks: bad input must leave every rank intact
    with launched(tmp_path_factory.mktemp("service_runs"), ["services.actor.world_size=2"]) as running:
        yield running


# ---- helpers ------------------------------------------------------------------------------

async def expect_error(coro, code: grpc.StatusCode, *fragments: str) -> str:
    """Await `coro`; it must fail with status `code` and a message containing every fragment."""
    try:
        await coro
    except TandemError as e:
        msg = str(e)
        assert e.code == code, f"expected {code.name}, got {e.code.name}: {msg}"
        for frag in fragments:
            assert frag in msg, f"{frag!r} not in {msg!r}"
        return msg
    raise AssertionError(f"call succeeded; expected {code.name} mentioning {fragments}")


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
