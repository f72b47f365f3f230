"""The controller's handles on the roles of a run: one typed client per service.

`connect` builds `Roles` from the endpoints a launcher returned; a step and the run call
through it. In colocated mode the rollout is the actor's process (it serves RolloutService
on its own weights), so `roles.rollout` talks to the actor's endpoint; in standalone mode
it is its own service, and `Roles.sync_rollout` copies the actor's weights to it.

Deliberately not here: starting services (controller/launchers/), the wire format of the
calls (controller/clients.py), when to sync (the run and the step decide).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller.clients import ActorClient, CriticClient, RewardClient, RolloutClient
from tandem.config import TandemConfig
from tandem.rpc.security import EndpointSecurity

ROLE_CLIENTS = {"actor": ActorClient, "reward": RewardClient, "rollout": RolloutClient, "critic": CriticClient}


def needed_roles(cfg: TandemConfig) -> list[str]:
    """The services a run of `cfg` talks to, in start order."""
    roles = ["actor", "reward"]
    if cfg.actor_rollout_ref.rollout.mode == "standalone":
        roles.append("rollout")
    if cfg.algorithm.adv_estimator == "gae":
        roles.append("critic")
    return roles


@dataclass
class Roles:
    actor: object
    rollout: object
    reward: object
    critic: object | None = None
    standalone_rollout: bool = False

    def _clients(self) -> list:
        return [c for c in (self.actor, self.rollout, self.reward, self.critic) if c is not None]

    def set_step(self, step: int) -> None:
        """Tag every later call (and so the services' logs) with the RL step."""
        for c in self._clients():
            c.set_metadata(x_step=step)

    async def sync_rollout(self) -> None:
        """Give a standalone rollout the actor's current weights (colocated: nothing to do).

        The one place weights move from actor to rollout. The transport today is the
        controller itself (ExportWeights from the actor, LoadWeights on the rollout, the
        weights passing through this process); the weight plane of DESIGN section 5
        (NCCL, CUDA IPC, a stream between the services) replaces the body of this method."""
        if self.standalone_rollout:
            weights, version = await self.actor.export_weights()
            await self.rollout.load_weights(weights, version)

    async def close(self) -> None:
        for c in self._clients():
            await c.close()


def security(cfg: TandemConfig, role: str) -> EndpointSecurity:
    """TLS and token for calling `role` (services.<role>.tls / .auth)."""
    return EndpointSecurity.from_section(getattr(cfg.services, role), f"services.{role}")


async def connect(cfg: TandemConfig, endpoints: Mapping[str, str], run_id: str) -> Roles:
    """A client per endpoint (with its TLS and token), each waited on until its service reports
    SERVING -> Roles."""
    s = cfg.services
    clients: dict[str, object] = {}
    try:
        for role, endpoint in endpoints.items():
            timeout_s = cfg.reward_model.timeout_s if role == "reward" else s.rpc_timeout_s
            clients[role] = ROLE_CLIENTS[role](endpoint, timeout_s=timeout_s, metadata={"x-run-id": run_id},
                                               security=security(cfg, role))
            await clients[role].wait_healthy(timeout_s=s.startup_timeout_s)
    except BaseException:
        for c in clients.values():
            await c.close()
        raise
    standalone = cfg.actor_rollout_ref.rollout.mode == "standalone"
    rollout = clients["rollout"] if standalone else RolloutClient(endpoints["actor"], timeout_s=s.rpc_timeout_s,
                                                                  security=security(cfg, "actor"))
    return Roles(actor=clients["actor"], rollout=rollout, reward=clients["reward"],
                 critic=clients.get("critic"), standalone_rollout=standalone)
