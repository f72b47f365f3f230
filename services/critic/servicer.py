"""CriticService adapter: decode, validate, call the CriticWorker on its thread, encode."""
from __future__ import annotations

from services.critic.front import CriticFront
from tandem import checkpoint
from tandem.data import codec, schemas
from tandem.rpc.errors import FailedPrecondition, InvalidArgument, NotFound
from tandem.serving.worker_thread import WorkerThread
from tandem.v1 import common_pb2, critic_pb2

SERVICE = "tandem.v1.CriticService"


class CriticServicer:
    def __init__(self, worker: CriticFront, thread: WorkerThread):
        self.worker = worker
        self.thread = thread

    async def ComputeValues(self, request, context):
        batch = codec.decode_batch(request.batch)
        schemas.check_sequences(batch, self.worker.vocab_size)
        out = await self.thread.run(self.worker.compute_values, batch)
        return critic_pb2.ComputeValuesResponse(batch=codec.encode_batch(out))

    async def UpdateCritic(self, request, context):
        batch = codec.decode_batch(request.batch)
        schemas.check_sequences(batch, self.worker.vocab_size, ("values", "returns"))
        metrics = await self.thread.run(self.worker.update_critic, batch)
        return critic_pb2.UpdateCriticResponse(metrics=metrics)

    async def SaveCheckpoint(self, request, context):
        if not request.path:
            raise InvalidArgument("path: must not be empty")
        path = await self.thread.run(self.worker.save, request.path)
        return common_pb2.SaveCheckpointResponse(path=path)

    async def LoadCheckpoint(self, request, context):
        if not checkpoint.is_checkpoint(request.path):
            raise NotFound(f"path: {request.path!r} is not a complete checkpoint directory")
        try:
            version = await self.thread.run(self.worker.load, request.path, request.trunk_only)
        except (KeyError, RuntimeError, ValueError) as e:
            raise FailedPrecondition(f"path: {request.path!r} does not fit this critic: {e}") from None
        return common_pb2.LoadCheckpointResponse(weights_version=version)
