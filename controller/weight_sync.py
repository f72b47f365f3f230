"""The controller's one weight-sync call: order every standalone rollout replica to pull a version.

The controller never touches the bytes (gigabytes per sync would make its one process the
bottleneck): each replica pulls `version` from the actor's endpoint itself
(tandem/weights/receiver.py) and answers with the version it now serves, the transport and the
bytes moved. All replicas sync concurrently from one export on the actor. Metrics:
`timing_s/weight_sync` (wall time of the whole sync), `weight_sync/bytes` (summed over
replicas), `perf/weight_sync_gbps` (those bytes over that time), and `rollout/weights_version`
(the version the next generation uses).
"""
from __future__ import annotations

import asyncio
import time

from tandem.algos import metrics as M


async def sync_weights(actor, replicas, version: int | None = None, force: bool = False) -> dict[str, float]:
    """actor: the ActorClient (its endpoint is the source); replicas: RolloutReplicas. version:
    None = the actor's current one. force: also accept a version not newer than a replica's
    (a run's first sync: attached or restarted rollouts may have seen another run's versions)."""
    t0 = time.perf_counter()
    if version is None:
        version = await actor.weights_version()
    replies = await asyncio.gather(*(c.sync_weights(version, actor.endpoint, force=force) for c in replicas.clients))
    for client, reply in zip(replicas.clients, replies):
        if reply.weights_version != version:
            raise RuntimeError(f"rollout {client.endpoint} serves weights version {reply.weights_version} "
                               f"after a sync to {version}")
    seconds = time.perf_counter() - t0
    replicas.expected_version = version
    moved = sum(r.bytes for r in replies)
    return {M.TIMING_WEIGHT_SYNC: seconds, M.WEIGHT_SYNC_BYTES: float(moved),
            M.WEIGHT_SYNC_GBPS: moved / seconds / 1e9, M.ROLLOUT_WEIGHTS_VERSION: float(version)}
