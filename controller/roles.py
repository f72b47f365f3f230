"""The controller's handles on the roles of a run: one typed client per service.

`connect` builds `Roles` from the endpoints a launcher returned; a step and the run call
through it. In colocated mode the rollout is the actor's process (it serves RolloutService
on its own weights), so `roles.rollout` talks to the actor's endpoint; in standalone mode
it is its own service (one or more replicas: controller/rollout_replicas.py), and
`Roles.sync_rollout` has it pull the actor's weights.

Deliberately not here: starting services (controller/launchers/), the wire format of the
calls (controller/clients.py), when to sync (the run and the step decide).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tandem.config import TandemConfig
from tandem.controller.clients import ActorClient, CriticClient, LifecycleClient, RewardClient, RolloutClient
from tandem.controller.launchers.commands import replica_index, service_of
from tandem.controller.rollout_replicas import RolloutReplicas, replica_roles
from tandem.controller.weight_sync import sync_weights
from tandem.rpc.protocol import check_protocol
from tandem.rpc.security import EndpointSecurity

ROLE_CLIENTS = {"actor": ActorClient, "reward": RewardClient, "rollout": RolloutClient, "critic": CriticClient}


def needed_roles(cfg: TandemConfig) -> list[str]:
    """The services a run of `cfg` talks to, in start order."""
    roles = ["actor", "reward"]
    if cfg.actor_rollout_ref.rollout.mode == "standalone":
        roles += replica_roles(cfg.services.rollout.replicas)
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

    async def sync_rollout(self, version: int | None = None, force: bool = False) -> dict[str, float]:
        """Have every standalone rollout replica pull the actor's weights (colocated: nothing to
        do) -> the sync's metrics. The one place the controller orders weights to move; the bytes
        go from actor to rollout over the weight plane (tandem/weights/, controller/weight_sync.py).
        version: the actor's after its update (None: ask it); force: a run's first sync (attached
        or restarted rollouts may have seen another run's versions)."""
        if not self.standalone_rollout:
            return {}
        return await sync_weights(self.actor, self.rollout, version, force=force)

    def service_clients(self, role: str) -> list:
        """The clients that talk to `role`'s service (colocated, the actor's serves the rollout
        too; `rollout-k`: the k-th standalone rollout replica)."""
        if service_of(role) == "rollout" and self.standalone_rollout:
            return [self.rollout.clients[replica_index(role)]]
        clients = [getattr(self, role)]
        if role == "actor" and not self.standalone_rollout:
            clients.append(self.rollout)
        return clients

    async def repoint(self, role: str, endpoint: str) -> None:
        """`role`'s service was restarted at `endpoint`: its clients talk to it from now on.

        With the local launcher a restarted service starts from the run's config.yaml, so this
        is all the reconfiguring it needs; a service that starts without a run config (long-lived
        services) gets its Configure call here."""
        for client in self.service_clients(role):
            await client.repoint(endpoint)

    async def close(self) -> None:
        for c in self._clients():
            await c.close()


def security(cfg: TandemConfig, role: str) -> EndpointSecurity:
    """TLS and token for calling `role` (services.<role>.tls / .auth; a rollout replica: the rollout's)."""
    return EndpointSecurity.from_section(getattr(cfg.services, service_of(role)), f"services.{service_of(role)}")


def attach_endpoints(cfg: TandemConfig, roles: list[str]) -> dict[str, str | None]:
    """{role: the endpoint to attach to, or None to start it}; rollout replicas take the
    comma-separated services.rollout.endpoint in order."""
    out = {}
    for role in roles:
        endpoint = getattr(cfg.services, service_of(role)).endpoint
        if endpoint and service_of(role) == "rollout":
            endpoint = endpoint.split(",")[replica_index(role)].strip()
        out[role] = endpoint
    return out


async def connect(cfg: TandemConfig, endpoints: Mapping[str, str], run_id: str, pad_id: int) -> Roles:
    """A client per endpoint (with its TLS and token), each waited on until its service reports
    SERVING -> Roles."""
    s = cfg.services
    clients: dict[str, object] = {}
    try:
        for role, endpoint in endpoints.items():
            timeout_s = cfg.reward_model.timeout_s if role == "reward" else s.rpc_timeout_s
            clients[role] = ROLE_CLIENTS[service_of(role)](endpoint, timeout_s=timeout_s,
                                                           metadata={"x-run-id": run_id}, security=security(cfg, role))
            await clients[role].wait_healthy(timeout_s=s.startup_timeout_s)
            if service_of(role) != "reward":  # (an external reward service speaks RewardService alone)
                await check_service_protocol(endpoint, role, security(cfg, role))
    except BaseException:
        for c in clients.values():
            await c.close()
        raise
    standalone = cfg.actor_rollout_ref.rollout.mode == "standalone"
    if standalone:
        rollout = RolloutReplicas([clients[r] for r in replica_roles(s.rollout.replicas)], pad_id)
    else:
        rollout = RolloutClient(endpoints["actor"], timeout_s=s.rpc_timeout_s, security=security(cfg, "actor"))
    return Roles(actor=clients["actor"], rollout=rollout, reward=clients["reward"],
                 critic=clients.get("critic"), standalone_rollout=standalone)


async def check_service_protocol(endpoint: str, role: str, sec: EndpointSecurity) -> None:
    """FailedPrecondition naming both versions when `role`'s service at `endpoint` speaks another
    Tandem protocol than this controller (tandem/rpc/protocol.py)."""
    lifecycle = LifecycleClient(endpoint, timeout_s=30, security=sec)
    try:
        theirs = (await lifecycle.describe())["protocol"]
    finally:
        await lifecycle.close()
    check_protocol(theirs, "controller", f"the {role} service at {endpoint}")
