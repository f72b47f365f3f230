"""RolloutService adapter: decode, validate, call the RolloutWorker, encode.

It lives in the library (not services/rollout) because two processes serve it: the
standalone rollout service and, in colocated mode, the actor (hybrid engine).
"""
from __future__ import annotations

from tandem.data import codec, schemas
from tandem.generation.sampling import SamplingParams
from tandem.rpc.errors import FailedPrecondition, InvalidArgument
from tandem.serving.rollout_front import RolloutFront
from tandem.serving.worker_thread import WorkerThread
from tandem.v1 import rollout_pb2
from tandem.weights import wire

SERVICE = "tandem.v1.RolloutService"


def sampling_from_proto(p: rollout_pb2.SamplingParams, vocab_size: int) -> SamplingParams:
    params = SamplingParams(
        max_new_tokens=p.max_new_tokens,
        temperature=p.temperature if p.HasField("temperature") else 1.0,
        top_p=p.top_p if p.HasField("top_p") else 1.0,
        top_k=max(0, p.top_k) if p.HasField("top_k") else 0,
        n=p.n if p.HasField("n") else 1,
        seed=p.seed if p.HasField("seed") else None,
        stop_token_ids=list(p.stop_token_ids),
        greedy=p.greedy,
        row_offset=p.row_offset)
    try:
        if params.row_offset < 0:
            raise ValueError(f"sampling.row_offset must be >= 0, got {params.row_offset}")
        params.validate(vocab_size)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None
    return params


class RolloutServicer:
    """receiver: the standalone rollout's WeightReceiver (tandem/weights/receiver.py); None for
    the colocated rollout, which serves the actor's own weights."""

    def __init__(self, worker: RolloutFront, thread: WorkerThread, receiver=None):
        self.worker = worker
        self.thread = thread
        self.receiver = receiver

    async def GenerateSequences(self, request, context):
        batch = codec.decode_batch(request.batch)
        schemas.check_prompts(batch, self.worker.vocab_size)
        params = sampling_from_proto(request.sampling, self.worker.vocab_size)
        out = await self.thread.run(self.worker.generate_sequences, batch, params)
        return rollout_pb2.GenerateSequencesResponse(batch=codec.encode_batch(out))

    def _receiver(self):
        if self.receiver is None:
            raise FailedPrecondition("colocated rollout shares the actor's weights; nothing to sync")
        return self.receiver

    async def SyncWeights(self, request, context):
        receiver = self._receiver()
        if not request.source:
            raise InvalidArgument("source: must be the host:port of the ActorService holding the weights")
        if request.weights_version < 0:
            raise InvalidArgument(f"weights_version: {request.weights_version} must be >= 0")
        result = await receiver.sync(request.weights_version, request.source,
                                     wire.transport_from_pb(request.transport), request.force)
        return rollout_pb2.SyncWeightsResponse(weights_version=result.version, bytes=result.bytes,
                                               transport=wire.TRANSPORTS.get(result.transport, 0),
                                               seconds=result.seconds, transfer_seconds=result.transfer_seconds)

    async def GetWeightsDigest(self, request, context):
        version, digests = await self._receiver().digest()
        return rollout_pb2.GetWeightsDigestResponse(weights_version=version, sha256=digests)
