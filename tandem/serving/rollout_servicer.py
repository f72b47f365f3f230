"""RolloutService adapter: decode, validate, call the RolloutWorker, encode.

It lives in the library (not services/rollout) because two processes serve it: the
standalone rollout service and, in colocated mode, the actor (hybrid engine).
"""
from __future__ import annotations

from tandem.data import codec, schemas
from tandem.generation.interrupt import GenerationAborted
from tandem.generation.sampling import SamplingParams
from tandem.rpc.errors import Aborted, InvalidArgument
from tandem.serving.rollout_front import RolloutFront
from tandem.serving.worker_thread import WorkerThread
from tandem.v1 import rollout_pb2

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
        greedy=p.greedy)
    try:
        params.validate(vocab_size)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None
    return params


class RolloutServicer:
    def __init__(self, worker: RolloutFront, thread: WorkerThread, allow_load_weights: bool = True):
        self.worker = worker
        self.thread = thread
        self.allow_load_weights = allow_load_weights

    async def GenerateSequences(self, request, context):
        batch = codec.decode_batch(request.batch)
        schemas.check_prompts(batch, self.worker.vocab_size)
        params = sampling_from_proto(request.sampling, self.worker.vocab_size)
        try:
            out = await self.thread.run(self.worker.generate_sequences, batch, params)
        except GenerationAborted as e:
            raise Aborted(str(e)) from None
        return rollout_pb2.GenerateSequencesResponse(batch=codec.encode_batch(out))

    async def LoadWeights(self, request, context):
        if not self.allow_load_weights:
            from tandem.rpc.errors import FailedPrecondition

            raise FailedPrecondition("colocated rollout shares the actor's weights; nothing to load")
        weights = codec.decode_named(request.weights)
        try:
            version = await self.thread.run(self.worker.load_weights, weights, request.weights_version)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        return rollout_pb2.LoadWeightsResponse(weights_version=version)
