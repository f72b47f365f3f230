"""Typed async clients for the four roles: DataProto in, DataProto / metrics out.

The only controller file that knows the generated tandem.v1 messages. Deliberately not
here: which services a run has and how they are reached (controller/roles.py), retries and
error mapping (tandem/rpc/client.py).
"""
from __future__ import annotations

from tandem.data import codec
from tandem.data.batch import DataProto
from tandem.rpc.client import ServiceClient
from tandem.v1 import (
    actor_pb2,
    actor_pb2_grpc,
    common_pb2,
    critic_pb2,
    critic_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)


class ActorClient(ServiceClient):
    def __init__(self, endpoint: str, **kw):
        super().__init__(endpoint, actor_pb2_grpc.ActorServiceStub, **kw)

    async def compute_log_prob(self, batch: DataProto, calculate_entropy=False) -> DataProto:
        r = await self.call("ComputeLogProb", actor_pb2.ComputeLogProbRequest(
            batch=codec.encode_batch(batch), calculate_entropy=calculate_entropy))
        return codec.decode_batch(r.batch)

    async def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        r = await self.call("ComputeRefLogProb", actor_pb2.ComputeRefLogProbRequest(batch=codec.encode_batch(batch)))
        return codec.decode_batch(r.batch)

    async def update_actor(self, batch: DataProto) -> tuple[dict, int]:
        r = await self.call("UpdateActor", actor_pb2.UpdateActorRequest(batch=codec.encode_batch(batch)))
        return dict(r.metrics), r.weights_version

    async def train_sft(self, batch: DataProto) -> dict:
        r = await self.call("TrainSft", actor_pb2.TrainSftRequest(batch=codec.encode_batch(batch)))
        return dict(r.metrics)

    async def set_reference(self) -> None:
        await self.call("SetReference", actor_pb2.SetReferenceRequest())

    async def export_weights(self) -> tuple[dict, int]:
        r = await self.call("ExportWeights", actor_pb2.ExportWeightsRequest())
        return codec.decode_named(r.weights), r.weights_version

    async def save_checkpoint(self, path: str) -> str:
        return (await self.call("SaveCheckpoint", common_pb2.SaveCheckpointRequest(path=path))).path

    async def load_checkpoint(self, path: str) -> int:
        return (await self.call("LoadCheckpoint", common_pb2.LoadCheckpointRequest(path=path))).weights_version


class RolloutClient(ServiceClient):
    def __init__(self, endpoint: str, **kw):
        super().__init__(endpoint, rollout_pb2_grpc.RolloutServiceStub, **kw)

    async def generate_sequences(self, batch: DataProto, *, max_new_tokens: int, n: int = 1,
                                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
                                 seed: int | None = None, greedy: bool = False) -> DataProto:
        params = rollout_pb2.SamplingParams(max_new_tokens=max_new_tokens, n=n, temperature=temperature,
                                            top_p=top_p, top_k=max(top_k, 0), greedy=greedy)
        if seed is not None:
            params.seed = seed
        r = await self.call("GenerateSequences", rollout_pb2.GenerateSequencesRequest(
            batch=codec.encode_batch(batch), sampling=params))
        return codec.decode_batch(r.batch)

    async def load_weights(self, weights: dict, version: int) -> int:
        r = await self.call("LoadWeights", rollout_pb2.LoadWeightsRequest(
            weights=codec.encode_named(weights), weights_version=version))
        return r.weights_version


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
