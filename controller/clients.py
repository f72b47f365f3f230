"""Typed async clients for the four roles (DataProto in, DataProto / metrics out) and for the
LifecycleService every one of them serves (take a run, give it back).

The only controller file that knows the generated tandem.v1 messages. Deliberately not
here: which services a run has and how they are reached (controller/roles.py), retries and
error mapping (tandem/rpc/client.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from tandem.data import codec
from tandem.data.batch import DataProto
from tandem.rpc.client import ServiceClient
from tandem.rpc.protocol import PROTOCOL
from tandem.rpc.security import PLAINTEXT, EndpointSecurity
from tandem.v1 import (
    actor_pb2,
    actor_pb2_grpc,
    common_pb2,
    critic_pb2,
    critic_pb2_grpc,
    lifecycle_pb2,
    lifecycle_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    weights_pb2,
)


@dataclass(frozen=True)
class KeptRows:
    """Rows the actor's colocated rollout kept (a generation's `kept_rows` meta), the ones named by
    number (None: all)."""

    key: str
    rows: list[int] | None = None


Rows = DataProto | KeptRows  # what the actor's calls work on: rows sent, or rows it holds


def _rows(rows: Rows) -> actor_pb2.Rows:
    if isinstance(rows, KeptRows):
        return actor_pb2.Rows(kept=actor_pb2.KeptRows(key=rows.key, rows=rows.rows or []))
    return actor_pb2.Rows(batch=codec.encode_batch(rows))


class ActorClient(ServiceClient):
    def __init__(self, endpoint: str, **kw):
        super().__init__(endpoint, actor_pb2_grpc.ActorServiceStub, **kw)

    async def compute_log_prob(self, rows: Rows, calculate_entropy=False, with_reference=False,
                               before_update=False) -> tuple[DataProto, int]:
        """-> (old_log_probs (+ entropys; with_reference: + ref_log_prob, the reference's pass in this
        call) [rows, response_len], update_rows: with before_update, the leading rows left to the
        update that follows (0 in old_log_probs))."""
        r = await self.call("ComputeLogProb", actor_pb2.ComputeLogProbRequest(
            rows=_rows(rows), calculate_entropy=calculate_entropy, with_reference=with_reference,
            before_update=before_update))
        return codec.decode_batch(r.batch), r.update_rows

    async def update_actor(self, rows: Rows, batch: DataProto) -> tuple[dict, int, DataProto | None, int]:
        """One PPO update on `rows` with `batch`'s per-row advantages (+ old_log_probs, ref_log_prob,
        rollout_log_probs; with kept rows the actor has the log-probs) -> (metrics, weights version,
        old_log_probs as the update used them (None over several epochs), update_rows)."""
        r = await self.call("UpdateActor", actor_pb2.UpdateActorRequest(rows=_rows(rows),
                                                                        batch=codec.encode_batch(batch)))
        return dict(r.metrics), r.weights_version, codec.decode_batch(r.batch) if r.HasField("batch") else None, \
            r.update_rows

    async def train_sft(self, batch: DataProto) -> dict:
        r = await self.call("TrainSft", actor_pb2.TrainSftRequest(batch=codec.encode_batch(batch)))
        return dict(r.metrics)

    async def set_reference(self) -> None:
        await self.call("SetReference", actor_pb2.SetReferenceRequest())

    async def weights_version(self) -> int:
        """The version a rollout would pull now (exports it on the actor, once per version)."""
        r = await self.call("GetWeightsManifest", weights_pb2.GetWeightsManifestRequest())
        return r.manifest.weights_version

    async def save_checkpoint(self, path: str) -> str:
        return (await self.call("SaveCheckpoint", common_pb2.SaveCheckpointRequest(path=path))).path

    async def load_checkpoint(self, path: str) -> int:
        return (await self.call("LoadCheckpoint", common_pb2.LoadCheckpointRequest(path=path))).weights_version


class RolloutClient(ServiceClient):
    def __init__(self, endpoint: str, **kw):
        super().__init__(endpoint, rollout_pb2_grpc.RolloutServiceStub, **kw)

    async def generate_sequences(self, batch: DataProto, *, max_new_tokens: int, n: int = 1,
                                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
                                 seed: int | None = None, greedy: bool = False, row_offset: int = 0,
                                 keep: dict | None = None) -> DataProto:
        """The generated rows; with keep (KeepRows' fields: calculate_entropy, with_reference,
        before_update) a colocated rollout's actor keeps them, queues that log-prob pass behind the
        generation, and the rows' meta `kept_rows` is their key (KeptRows)."""
        params = rollout_pb2.SamplingParams(max_new_tokens=max_new_tokens, n=n, temperature=temperature,
                                            top_p=top_p, top_k=max(top_k, 0), greedy=greedy, row_offset=row_offset)
        if seed is not None:
            params.seed = seed
        r = await self.call("GenerateSequences", rollout_pb2.GenerateSequencesRequest(
            batch=codec.encode_batch(batch), sampling=params,
            keep=rollout_pb2.KeepRows(**keep) if keep is not None else None))
        out = codec.decode_batch(r.batch)
        if r.kept_rows:
            out.meta["kept_rows"] = r.kept_rows
        return out

    async def sync_weights(self, version: int, source: str, *, transport: str | None = None,
                           force: bool = False) -> rollout_pb2.SyncWeightsResponse:
        """Have the rollout pull `version` from the ActorService at `source` (transport: "stream",
        "ipc", "collective", or None for the rollout's configured choice)."""
        kinds = {None: weights_pb2.WEIGHT_TRANSPORT_UNSPECIFIED, "stream": weights_pb2.WEIGHT_TRANSPORT_STREAM,
                 "ipc": weights_pb2.WEIGHT_TRANSPORT_IPC, "collective": weights_pb2.WEIGHT_TRANSPORT_COLLECTIVE}
        return await self.call("SyncWeights", rollout_pb2.SyncWeightsRequest(
            weights_version=version, source=source, transport=kinds[transport], force=force))

    async def weights_digest(self) -> tuple[int, dict[str, str]]:
        r = await self.call("GetWeightsDigest", rollout_pb2.GetWeightsDigestRequest())
        return r.weights_version, dict(r.sha256)


class CriticClient(ServiceClient):
    def __init__(self, endpoint: str, **kw):
        super().__init__(endpoint, critic_pb2_grpc.CriticServiceStub, **kw)

    async def compute_values(self, batch: DataProto) -> DataProto:
        r = await self.call("ComputeValues", critic_pb2.ComputeValuesRequest(batch=codec.encode_batch(batch)))
        return codec.decode_batch(r.batch)

    async def update_critic(self, batch: DataProto) -> dict:
        r = await self.call("UpdateCritic", critic_pb2.UpdateCriticRequest(batch=codec.encode_batch(batch)))
        return dict(r.metrics)

    async def save_checkpoint(self, path: str) -> str:
        return (await self.call("SaveCheckpoint", common_pb2.SaveCheckpointRequest(path=path))).path

    async def load_checkpoint(self, path: str, trunk_only: bool = False) -> int:
        r = await self.call("LoadCheckpoint", common_pb2.LoadCheckpointRequest(path=path, trunk_only=trunk_only))
        return r.weights_version


class RewardClient(ServiceClient):
    def __init__(self, endpoint: str, **kw):
        super().__init__(endpoint, reward_pb2_grpc.RewardServiceStub, **kw)

    async def score(self, batch: DataProto) -> list[float]:
        return (await self.score_rows(batch))[0]

    async def score_rows(self, batch: DataProto) -> tuple[list[float], dict[int, str]]:
        """-> (one score per row, {row: reason} for the rows the service could not score)."""
        r = await self.call("Score", reward_pb2.ScoreRequest(batch=codec.encode_batch(batch)))
        return list(r.scores), {int(f.row): f.reason for f in r.failures}


class LifecycleClient(ServiceClient):
    """A long-lived service's run slot: Configure (take a run), Release, Interrupt, Describe."""

    def __init__(self, endpoint: str, **kw):
        super().__init__(endpoint, lifecycle_pb2_grpc.LifecycleServiceStub, **kw)

    async def configure(self, run_id: str, config_yaml: str) -> tuple[list[int], bool]:
        """-> (the service's rank pids, whether its ranks were restarted for the run's layout)."""
        r = await self.call("Configure", lifecycle_pb2.ConfigureRequest(run_id=run_id, config_yaml=config_yaml,
                                                                        protocol=PROTOCOL))
        return list(r.pids), r.ranks_restarted

    async def release(self, run_id: str = "") -> str:
        return (await self.call("Release", lifecycle_pb2.ReleaseRequest(run_id=run_id))).released_run_id

    async def interrupt(self, run_id: str = "") -> str:
        return (await self.call("Interrupt", lifecycle_pb2.InterruptRequest(run_id=run_id))).run_id

    async def describe(self) -> dict:
        """{role, run_id ("" when free), world_size, pids, tensor_parallel, pipeline_parallel,
        expert_parallel, tensor_bytes, interrupted, protocol, startup: [(phase, seconds)] of the held run's start}."""
        r = await self.call("Describe", lifecycle_pb2.DescribeRequest())
        return {"role": r.role, "run_id": r.run_id, "world_size": r.world_size, "pids": list(r.pids),
                "tensor_parallel": r.tensor_parallel, "pipeline_parallel": r.pipeline_parallel,
                "expert_parallel": r.expert_parallel, "tensor_bytes": r.tensor_bytes, "interrupted": r.interrupted,
                "protocol": r.protocol, "startup": [(p.name, p.seconds) for p in r.startup]}


def release_now(endpoint: str, run_id: str, timeout_s: float, security: EndpointSecurity = PLAINTEXT) -> str:
    """LifecycleService.Release from synchronous code (a launcher's stop runs outside any
    event loop's reach) -> the released run id; the TandemError of a failed call."""
    import grpc

    from tandem.rpc.errors import error_from_rpc

    with security.sync_channel(endpoint, []) as channel:
        try:
            r = lifecycle_pb2_grpc.LifecycleServiceStub(channel).Release(
                lifecycle_pb2.ReleaseRequest(run_id=run_id), timeout=timeout_s)
        except grpc.RpcError as e:
            raise error_from_rpc(e, "LifecycleService.Release") from None
    return r.released_run_id
