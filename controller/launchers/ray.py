"""The Ray launcher: each service's ranks as Ray actors, placed by one placement group per service.

`trainer.launcher=ray` connects to the cluster in $RAY_ADDRESS (Ray's own variable; unset: a
one-node Ray on this machine). For each role the run needs it reserves a placement group of one
bundle per rank ({CPU: services.<role>.ray.num_cpus, GPU: .num_gpus, **.resources}), packed
STRICT_PACK when the role runs tensor parallel (its all-reduces need the node's NVLink) and
SPREAD otherwise, unless `services.<role>.ray.strategy` says. Each bundle gets a `ServiceRank`
actor (ray_rank.py) that starts the rank's process with commands.py's command, bound to its
node's address; a multi-rank service meets at rank 0's node over TCP (MASTER_ADDR/MASTER_PORT).
Rank 0 reports its port through the actor's return value and the launcher returns
`<node ip>:<port>` per role. Each rank logs its Ray node id (`service.process` lines).

Run directories must be on storage every node mounts (services read the run's config and write
logs and checkpoints there); a node that cannot see the config is an error saying so.

Restarts (crash recovery, controller/recovery.py): a rank's process dies with its actor (ray_rank.py)
and Ray brings a dead actor back in its own bundle (max_restarts=-1: how often a service may be
restarted is trainer.max_restarts, the controller's); `restart(role)` kills what is left of every rank
(a hung one too) and starts them all again on their actors, like the first start. A service is running
while every rank's actor answers and its process runs (`is_running`).

Deliberately not here: shipping run directories between nodes, autoscaling.
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from tandem.controller.launchers import LaunchContext, Launcher
from tandem.controller.launchers.commands import service_argv, service_env, service_of
from tandem.controller.launchers.ray_rank import ServiceRank
from tandem.controller.launchers.start_failure import ServiceStartFailed
from tandem.logging import get_logger
from tandem.serving.allowed_dirs import code_dirs

_log = get_logger("controller.launchers.ray")
STATE_TIMEOUT_S = 5.0  # an actor answers at once unless Ray is bringing it back


def _import_ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError("trainer.launcher=ray needs Ray: pip install -e '.[ray]'") from None
    return ray


def tensor_parallel(cfg, role: str) -> int:
    if role == "actor":
        return cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size
    if role == "critic":
        return cfg.critic.megatron.tensor_model_parallel_size
    if role == "reward" and cfg.reward_model.enable:
        return cfg.reward_model.megatron.tensor_model_parallel_size
    if service_of(role) == "rollout" and cfg.actor_rollout_ref.rollout.mode == "standalone":
        return cfg.actor_rollout_ref.rollout.tensor_model_parallel_size or 1
    return 1


def placement(cfg, role: str) -> tuple[list[dict], str]:
    """(one bundle per rank, the placement strategy) for `role` under `cfg`."""
    s = getattr(cfg.services, service_of(role))
    bundle = {"CPU": s.ray.num_cpus, "GPU": s.ray.num_gpus, **s.ray.resources}
    bundle = {k: float(v) for k, v in bundle.items() if v}
    strategy = s.ray.strategy or ("STRICT_PACK" if tensor_parallel(cfg, role) > 1 else "SPREAD")
    return [dict(bundle) for _ in range(s.world_size)], strategy


class RayLauncher(Launcher):
    """Services as Ray actors (see the module doc)."""

    def __init__(self, ctx: LaunchContext):
        super().__init__(ctx)
        self.groups: dict[str, tuple[object, list]] = {}  # role -> (placement group, rank actors)
        self.nodes: dict[str, list[dict]] = {}  # role -> each rank's {node_id, ip, hostname}
        self._ray = None
        self._owns_ray = False

    async def start(self, roles: Sequence[str]) -> dict[str, str]:
        if not roles:
            return {}
        ray = self._ray = _import_ray()
        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=False,
                     logging_level="warning", configure_logging=False)
            self._owns_ray = True
        for role in roles:
            self._reserve(role)
        ready = [pg.ready() for pg, _ in self.groups.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*ready), self.ctx.startup_timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"Ray could not place {list(roles)} within {self.ctx.startup_timeout_s:g}s "
                               f"(bundles: {[placement(self.ctx.cfg, r) for r in roles]}; cluster: "
                               f"{ray.available_resources()})") from None
        ports = await asyncio.gather(*(self._start_ranks(role) for role in roles))
        return {role: f"{self.nodes[role][0]['ip']}:{port}" for role, port in zip(roles, ports)}

    def _reserve(self, role: str) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundles, strategy = placement(self.ctx.cfg, role)
        pg = placement_group(bundles, strategy=strategy, name=f"tandem-{self.ctx.run_id}-{role}")
        actor_cls = self._ray.remote(ServiceRank)
        actors = [actor_cls.options(num_cpus=b.get("CPU", 0), num_gpus=b.get("GPU", 0),
                                    resources={k: v for k, v in b.items() if k not in ("CPU", "GPU")},
                                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i),
                                    max_restarts=-1).remote()
                  for i, b in enumerate(bundles)]
        self.groups[role] = (pg, actors)
        _log.info("ray.reserved", role=role, bundles=bundles, strategy=strategy)

    async def _start_ranks(self, role: str) -> int:
        """Start every rank of `role` -> rank 0's bound port once it serves."""
        _, actors = self.groups[role]
        nodes = self.nodes[role] = list(await asyncio.gather(*(a.node.remote() for a in actors)))
        host = self.ctx.hosts.get(service_of(role), "127.0.0.1")
        logs = os.path.join(self.ctx.run_dir, "logs")
        master = None
        if len(actors) > 1:
            master = (nodes[0]["ip"], await actors[0].free_port.remote(nodes[0]["ip"]))
        starts = []
        for rank, (actor, node) in enumerate(zip(actors, nodes)):
            bind = node["ip"] if host == "127.0.0.1" else host  # loopback is unreachable from other nodes
            port_file = os.path.join(logs, f"{role}.port") if rank == 0 else None
            cfg = self.ctx.cfg
            argv = service_argv(role, self.ctx.config_path, host=bind, port_file=port_file, run_id=self.ctx.run_id,
                                rank=rank if master else None, allow_dirs=code_dirs(cfg) if cfg else (),
                                insecure=bool(cfg and cfg.services.insecure))
            env = service_env(master=master, local_rank=0 if master else None, node_id=node["node_id"])
            log = os.path.join(logs, f"{role}.log" if rank == 0 else f"{role}.rank{rank}.log")
            _log.info("ray.rank_placed", role=role, rank=rank, node_id=node["node_id"], ip=node["ip"])
            starts.append(actor.start.remote(argv, env, log, self.ctx.config_path, port_file,
                                             self.ctx.startup_timeout_s))
        try:
            return (await asyncio.gather(*starts))[0]
        except Exception as e:  # a RayTaskError wraps the actor's own message
            raise ServiceStartFailed(f"the {role} service failed to start under Ray: "
                                     f"{getattr(e, 'cause', None) or e}") from e

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop each service's rank 0 first (it releases the other ranks), then the rest; remove the
        placement groups; disconnect from Ray if this launcher connected."""
        if self._ray is None:
            return
        ray = self._ray
        from ray.util.placement_group import remove_placement_group

        for role, (pg, actors) in self.groups.items():
            for actor in actors:  # rank 0 first
                try:
                    ray.get(actor.stop.remote(grace_s), timeout=grace_s + 5)
                except Exception as e:  # noqa: BLE001 - the actor may be gone already; kill it regardless
                    _log.warning("ray.stop_failed", role=role, error=str(e))
                ray.kill(actor)
            remove_placement_group(pg)
        self.groups.clear()
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    async def restart(self, role: str, hung: bool = False) -> str:
        if role not in self.groups:
            raise ValueError(f"no {role} service was started by this launcher; started: {sorted(self.groups)}")
        ray = self._ray
        _, actors = self.groups[role]

        async def kill(actor) -> None:
            try:
                await actor.kill.remote()
            except ray.exceptions.RayActorError:
                pass  # the actor died for good, and its rank with it: nothing is left

        await asyncio.gather(*(kill(a) for a in actors))  # a restarted actor answers once Ray brought it back
        port = await self._start_ranks(role)
        _log.info("ray.restarted", role=role, nodes=[n["node_id"] for n in self.nodes[role]])
        return f"{self.nodes[role][0]['ip']}:{port}"

    def _states(self, role: str) -> list[str] | None:
        """Each rank's state (ray_rank.ServiceRank.state, or that its actor is gone); None when the
        actors do not all answer within a few seconds (Ray may be restarting one)."""
        ray = self._ray
        states = []
        for actor in self.groups[role][1]:
            try:
                states.append(ray.get(actor.state.remote(), timeout=STATE_TIMEOUT_S))
            except ray.exceptions.GetTimeoutError:
                return None
            except ray.exceptions.RayActorError:
                states.append("its Ray actor died")
        return states

    def is_running(self, role: str) -> bool | None:
        if role not in self.groups:
            return None
        states = self._states(role)
        return None if states is None else all(state == "running" for state in states)

    def describe(self, role: str) -> str:
        states = self._states(role) if role in self.groups else None
        ranks = "no answer from its Ray actors" if states is None else \
            "; ".join(f"rank {rank}: {state}" for rank, state in enumerate(states) if state != "running") or "running"
        return f"{ranks}; log {os.path.join(self.ctx.run_dir, 'logs', f'{role}.log')}"
