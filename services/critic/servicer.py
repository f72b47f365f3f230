"""CriticService adapter: decode, validate, call the CriticWorker on its thread, encode."""
from __future__ import annotations

from tandem.data import codec, schemas
from tandem.rpc.errors import FailedPrecondition
from tandem.services.critic.front import CriticFront
from tandem.serving import checkpoint_requests
from tandem.serving.worker_thread import WorkerThread
from tandem.v1 import common_pb2, critic_pb2

SERVICE = "tandem.v1.CriticService"


class CriticServicer:
    def __init__(self, worker: CriticFront, thread: WorkerThread):
        self.worker = worker
        self.thread = thread

    def _require_weights(self) -> None:
        if not self.worker.local.weights_loaded:
            raise FailedPrecondition(
                "the critic's weights are not loaded yet: it starts from the policy (critic.init_from_policy), "
                "so LoadCheckpoint comes first (trunk_only from an actor checkpoint, or a critic checkpoint); "
                "nothing was computed or written")

    async def ComputeValues(self, request, context):
        batch = codec.decode_batch(request.batch)
        schemas.check_sequences(batch, self.worker.vocab_size)
        schemas.check_meta(batch)
        self._require_weights()
        out = await self.thread.run(self.worker.compute_values, batch)
        return critic_pb2.ComputeValuesResponse(batch=codec.encode_batch(out))

    async def UpdateCritic(self, request, context):
        batch = codec.decode_batch(request.batch)
        schemas.check_sequences(batch, self.worker.vocab_size, ("values", "returns"))
        schemas.check_meta(batch)
        self._require_weights()
        metrics = await self.thread.run(self.worker.update_critic, batch)
        return critic_pb2.UpdateCriticResponse(metrics=metrics)

    async def SaveCheckpoint(self, request, context):
        path = checkpoint_requests.save_path(request.path)
        self._require_weights()
        path = await self.thread.run(self.worker.save, path)
        return common_pb2.SaveCheckpointResponse(path=path)

    async def LoadCheckpoint(self, request, context):
        path = checkpoint_requests.load_path(request.path)
        try:
            version = await self.thread.run(self.worker.load, path, request.trunk_only)
        except checkpoint_requests.LOAD_ERRORS as e:
            raise FailedPrecondition(f"path: {path!r} does not fit this critic: {e}") from None
        return common_pb2.LoadCheckpointResponse(weights_version=version)
