"""Real service processes started by the controller's local launcher, as `tandem run` starts them:
actor (colocated: it also serves RolloutService), reward and critic from a run's config.yaml, and
standalone rollouts (`rollout`, `rollout-1`: replicas) from a copy with rollout.mode=standalone,
all at once.

Used by tests/services/conftest.py (the session's services) and bench/fuzz_services.py.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, replace

SERVICE_OVERRIDES = [
    "data.builtin_train_size=200", "data.builtin_val_size=16", "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_mini_batch_size=4",
    "actor_rollout_ref.model.init_std=0.3", "actor_rollout_ref.rollout.mode=colocated",
    "actor_rollout_ref.actor.ppo_epochs=1", "actor_rollout_ref.actor.shuffle=false",
    "actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false",
    "services.actor.torch_threads=1"]


@dataclass
class Started:
    cfg: object
    run_dir: str
    run_id: str
    endpoints: dict  # role -> host:port
    pids: dict  # role -> pid of its rank 0
    launchers: list
    critic_before_load: object = None  # the critic's answer to a save before its trunk was loaded


def start_services(base_dir: str, experiment: str, overrides=(),
                   roles=("actor", "reward", "critic", "rollout", "rollout-1")) -> Started:
    """Start `roles` (actor, reward, critic and standalone rollout replicas) under a new run
    directory in `base_dir`; stop them with `stop_services`."""
    from tandem.config import load_config, to_yaml
    from tandem.controller.launchers import LaunchContext
    from tandem.controller.launchers.commands import service_of
    from tandem.controller.launchers.local import LocalLauncher
    from tandem.controller.run_dir import create_run_dir

    cfg = load_config(None, [f"trainer.default_local_dir={base_dir}", f"trainer.experiment_name={experiment}",
                             *SERVICE_OVERRIDES, *overrides])
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
        main, alone = await asyncio.gather(launchers[0].start([r for r in roles if service_of(r) != "rollout"]),
                                           launchers[1].start([r for r in roles if service_of(r) == "rollout"]))
        return {**main, **alone}

    try:
        endpoints = asyncio.run(start())
    except BaseException:
        stop_services(launchers)
        raise
    pids = {role: proc.pid for launcher in launchers for role, proc in launcher.processes.items()}
    started = Started(cfg, run_dir, run_id, endpoints, pids, launchers)
    if "critic" in endpoints and "actor" in endpoints and cfg.critic.init_from_policy:
        try:
            started.critic_before_load = asyncio.run(critic_from_policy(started))
        except BaseException:
            stop_services(launchers)
            raise
    return started


async def critic_from_policy(started: Started):
    """What a run's warm start does (controller/run.py): the critic's trunk from the actor's policy.
    Returns the error the critic answered a SaveCheckpoint with before that load."""
    from tandem.controller.clients import ActorClient, CriticClient
    from tandem.controller.roles import security
    from tandem.rpc.errors import TandemError

    kw = dict(timeout_s=120, metadata={"x-run-id": started.run_id})
    actor = ActorClient(started.endpoints["actor"], security=security(started.cfg, "actor"), **kw)
    critic = CriticClient(started.endpoints["critic"], security=security(started.cfg, "critic"), **kw)
    init = os.path.join(started.run_dir, "checkpoints", "init")
    try:
        try:
            await critic.save_checkpoint(os.path.join(init, "critic"))
            refused = None
        except TandemError as e:
            refused = e
        await critic.load_checkpoint(await actor.save_checkpoint(os.path.join(init, "actor")), trunk_only=True)
    finally:
        await actor.close()
        await critic.close()
    return refused


def stop_services(launchers) -> None:
    for launcher in launchers:
        launcher.stop()
