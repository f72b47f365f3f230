"""Long-lived services: started with no run, they take one with Configure and give it back with
Release (tandem.v1.LifecycleService), a second run's layout restarting their ranks (gloo, 2 ranks),
the weight plane between a long-lived actor and rollout freed with the run.

Real processes, started as the controller service starts them (controller/service/pool.py), so
every call carries the pool's token.
"""
import asyncio
import os

import grpc
import psutil
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rpc_expect import expect_error  # tests/helpers

from tandem.config import load_config, to_yaml
from tandem.controller.clients import ActorClient, LifecycleClient, RewardClient, RolloutClient
from tandem.controller.run_dir import create_run_dir
from tandem.controller.service.pool import ServicePool
from tandem.data.batch import DataProto
from tandem.rpc.client import make_channel

FAILED, INVALID = grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
SMALL = ["data.builtin_train_size=50", "data.builtin_val_size=8", "actor_rollout_ref.rollout.n=2",
         "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "services.actor.torch_threads=1"]
TP2 = ["services.actor.world_size=2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"]


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    state = tmp_path_factory.mktemp("pool")
    pool = ServicePool(str(state), startup_timeout_s=300)
    try:
        asyncio.run(pool.ensure(["actor", "reward"]))
        yield pool
    finally:
        pool.stop()


@pytest.fixture(scope="module")
def run_config(pool, tmp_path_factory):
    """A run's config as the controller service sends it: its services called with the pool's token."""
    cfg = load_config(None, [f"trainer.default_local_dir={tmp_path_factory.mktemp('runs')}", *SMALL])
    cfg, _ = create_run_dir(pool.with_tokens(cfg))
    return to_yaml(cfg)


async def health(endpoint: str, service: str, security) -> int:
    async with make_channel(endpoint, security=security) as ch:
        return (await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service))).status


def prompts(cfg_yaml: str) -> DataProto:
    from transformers import AutoTokenizer

    from tandem.generation.engine import left_pad

    tok = AutoTokenizer.from_pretrained(load_config(text=cfg_yaml).actor_rollout_ref.model.tokenizer_path)
    rows = [[tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"] for t in ("12+7=", "3+4=")]
    ids, mask = left_pad(rows, tok.pad_token_id)
    return DataProto(tensors={"input_ids": ids, "attention_mask": mask})


def test_configure_release_and_the_holder(pool, run_config):
    async def main():
        ep = pool.endpoints["actor"]
        life = LifecycleClient(ep, security=pool.security("actor"), timeout_s=300)
        free = await life.describe()
        assert free["run_id"] == "" and free["role"] == "actor" and free["pids"] == [pool.started["actor"]]
        assert await health(ep, "", pool.security("actor")) == SERVING and await health(ep, "tandem.v1.ActorService", pool.security("actor")) == NOT_SERVING
        await expect_error(ActorClient(ep, security=pool.security("actor")).set_reference(), FAILED, "holds no run", "Configure")

        pids, restarted = await life.configure("run-a", run_config)
        assert pids == free["pids"] and not restarted
        held = await life.describe()
        assert held["run_id"] == "run-a" and held["tensor_bytes"] > 10 * free["tensor_bytes"]
        # the run's start-up phases, in order (no checkpoint: no load; long-lived: no process start)
        compiled = ["compile wrap"] if torch.cuda.is_available() else []  # use_torch_compile, on GPUs only
        assert free["startup"] == [] and [name for name, _ in held["startup"]] == [
            "config, seed", "tokenizer", "build policy", "DDP wrap (gradient buffers)", "build reference", *compiled,
            "copy policy to reference", "optimizer", "colocated rollout", "build, other", "servicers"]
        assert all(s >= 0 for _, s in held["startup"]) and dict(held["startup"])["build policy"] > 0
        assert await health(ep, "tandem.v1.ActorService", pool.security("actor")) == SERVING
        assert await health(ep, "tandem.v1.RolloutService", pool.security("actor")) == SERVING  # colocated: the actor generates
        gen = await RolloutClient(ep, security=pool.security("actor")).generate_sequences(prompts(run_config), max_new_tokens=4, greedy=True)
        assert gen["responses"].shape == (2, 4)

        # a second run while one is held, a call for another run, a release of another run: refused
        await expect_error(life.configure("run-b", run_config), FAILED, "holds run 'run-a'")
        await expect_error(ActorClient(ep, security=pool.security("actor"), metadata={"x-run-id": "run-b"}).set_reference(), FAILED,
                           "called for run 'run-b'", "holds run 'run-a'")
        await expect_error(life.release("run-b"), FAILED, "holds run 'run-a'")
        assert (await life.describe())["run_id"] == "run-a"

        assert await life.release("run-a") == "run-a"
        after = await life.describe()
        assert after["run_id"] == "" and after["tensor_bytes"] < held["tensor_bytes"] / 10, (held, after)
        assert after["startup"] == []
        assert await health(ep, "tandem.v1.ActorService", pool.security("actor")) == NOT_SERVING and await health(ep, "", pool.security("actor")) == SERVING
        assert await life.release() == ""  # nothing held: nothing to do

        # a bad config names the key and leaves the service free
        bad = run_config.replace("data:", "data:\n  bogus_key: 1", 1)
        await expect_error(life.configure("run-c", bad), INVALID, "data.bogus_key")
        assert (await life.describe())["run_id"] == ""
        await life.close()

    asyncio.run(main())


def test_reward_takes_the_runs_rule(pool, run_config):
    async def main():
        ep = pool.endpoints["reward"]
        life, reward = LifecycleClient(ep, security=pool.security("actor"), timeout_s=120), RewardClient(ep, security=pool.security("actor"))
        batch = DataProto(columns={"response_text": ["19", "5 #### 7"], "ground_truth": ["19", "7"]})
        await expect_error(reward.score(batch), FAILED, "holds no run")
        await life.configure("run-r1", run_config)  # arithmetic rule: the text must equal the answer
        assert await reward.score(batch) == [1.0, 0.0]
        await life.release("run-r1")
        gsm8k = to_yaml(load_config(text=run_config, overrides=["reward_model.default_rule=gsm8k"]))
        await life.configure("run-r2", gsm8k)  # the next run's rule: the answer after ####
        assert (await reward.score(batch))[1] == 1.0
        await life.release("run-r2")

    asyncio.run(main())


def test_another_layout_restarts_the_ranks(pool, run_config):
    """TP=2 on two ranks, then back to one rank: rank 0 (the endpoint) stays, its children change."""
    async def main():
        ep = pool.endpoints["actor"]
        life = LifecycleClient(ep, security=pool.security("actor"), timeout_s=600)
        rank0 = pool.started["actor"]
        tp2 = to_yaml(load_config(text=run_config, overrides=TP2))
        want = await generate(life, ep, run_config, "run-tp1")

        pids, restarted = await life.configure("run-tp2", tp2)
        assert restarted and len(pids) == 2 and pids[0] == rank0
        d = await life.describe()
        assert (d["world_size"], d["tensor_parallel"], d["pids"]) == (2, 2, pids)
        phases = [name for name, _ in d["startup"]]  # the ranks restarted: their start, then rank 1's wait
        assert phases[0] == "rank group" and phases.index("other ranks") == len(phases) - 2, phases
        got = await RolloutClient(ep, security=pool.security("actor")).generate_sequences(prompts(run_config), max_new_tokens=4, greedy=True)
        assert got["responses"].tolist() == want["responses"].tolist()  # the same weights, split over 2 ranks
        await life.release("run-tp2")
        assert (await life.describe())["world_size"] == 2  # released, the ranks stay for the next run

        pids1, restarted = await life.configure("run-tp1b", run_config)
        assert restarted and pids1 == [rank0]
        child = pids[1]
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        await life.release("run-tp1b")
        await life.close()

    async def generate(life, ep, cfg_yaml, run_id):
        await life.configure(run_id, cfg_yaml)
        try:
            return await RolloutClient(ep, security=pool.security("actor")).generate_sequences(prompts(cfg_yaml), max_new_tokens=4, greedy=True)
        finally:
            await life.release(run_id)

    asyncio.run(main())


def test_pool_file_names_the_started_services(pool):
    entries = __import__("json").load(open(os.path.join(pool.dir, "pool.json")))
    assert {r: e["pid"] for r, e in entries.items()} == pool.started
    assert all(e["endpoint"] == pool.endpoints[r] for r, e in entries.items())


def test_interrupt_cuts_a_generation_until_release(pool, run_config):
    """Interrupt (a cancel) stops a generation in progress with ABORTED, and the next ones, until
    the run is released; the next run generates again."""
    async def main():
        ep = pool.endpoints["actor"]
        life = LifecycleClient(ep, security=pool.security("actor"), timeout_s=300)
        rollout = RolloutClient(ep, security=pool.security("actor"), timeout_s=600)
        batch = prompts(run_config).repeat(64)  # many rounds of 8 rows: long enough to be cut
        long = dict(max_new_tokens=16, n=8, temperature=1.0, seed=1)
        slow = to_yaml(load_config(text=run_config, overrides=["actor_rollout_ref.rollout.max_batch_size=8"]))
        await life.configure("run-i", slow)
        call = asyncio.create_task(rollout.generate_sequences(batch, **long))
        await asyncio.sleep(1.0)
        assert not call.done(), "the generation ended before the interrupt: make it longer"
        assert await life.interrupt("run-i") == "run-i"
        await expect_error(call, grpc.StatusCode.ABORTED, "interrupted")
        assert (await life.describe())["interrupted"]
        await expect_error(rollout.generate_sequences(batch, **long), grpc.StatusCode.ABORTED)
        await life.release("run-i")
        await life.configure("run-j", run_config)
        assert not (await life.describe())["interrupted"]
        gen = await rollout.generate_sequences(prompts(run_config), max_new_tokens=4, greedy=True)
        assert gen["responses"].shape == (2, 4)
        await life.release("run-j")

    asyncio.run(main())


def test_weight_plane_between_long_lived_services_is_freed_at_release(pool, run_config):
    """A standalone rollout pulls the actor's weights (stream and gloo collective), then both
    give the run back: the staging buffer, the actor's export and the weight group go with it,
    and the next run syncs again."""
    async def main():
        endpoints = await pool.ensure(["actor", "rollout"])
        standalone = to_yaml(load_config(text=run_config, overrides=["actor_rollout_ref.rollout.mode=standalone"]))
        lives = {role: LifecycleClient(endpoints[role], security=pool.security("actor"), timeout_s=300) for role in ("actor", "rollout")}
        free = {role: (await life.describe())["tensor_bytes"] for role, life in lives.items()}
        for run_id in ("run-w1", "run-w2"):
            for life in lives.values():
                await life.configure(run_id, standalone)
            rollout = RolloutClient(endpoints["rollout"], security=pool.security("actor"), timeout_s=300)
            for transport in ("stream", "collective"):  # the actor's version 0, pulled both ways
                synced = await rollout.sync_weights(0, endpoints["actor"], transport=transport, force=True)
                assert synced.weights_version == 0 and synced.bytes > 0
            held = {role: (await life.describe())["tensor_bytes"] for role, life in lives.items()}
            for role, life in lives.items():
                assert await life.release(run_id) == run_id
                after = (await life.describe())["tensor_bytes"]
                assert after < held[role] / 10 and after <= free[role] + 1024, (role, free, held, after)
        for life in lives.values():
            await life.close()

    asyncio.run(main())
