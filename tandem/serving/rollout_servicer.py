"""RolloutService adapter: decode, validate, call the RolloutWorker, encode.

It lives in the library (not services/rollout) because two processes serve it: the
standalone rollout service and, in colocated mode, the actor (hybrid engine).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tandem.data import codec, schemas
from tandem.generation.interrupt import GenerationAborted
from tandem.generation.sampling import SamplingParams
from tandem.rpc.errors import Aborted, FailedPrecondition, InvalidArgument, ResourceExhausted
from tandem.serving.rollout_front import RolloutFront
from tandem.serving.worker_thread import WorkerThread
from tandem.v1 import rollout_pb2
from tandem.weights import wire

SERVICE = "tandem.v1.RolloutService"
MAX_MESSAGE_BYTES = 512 * 2**20  # tandem.rpc.server's default max message size
# prompts, responses, input_ids, attention_mask (int64) and rollout_log_probs (fp32), per output token
BYTES_PER_OUTPUT_TOKEN = 8 * 4 + 4


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


@dataclass(frozen=True)
class GenerationLimits:
    """What one GenerateSequences may ask for."""

    max_positions: int  # the model's max_position_embeddings: a prompt and its response fit in it
    max_batch_size: int  # actor_rollout_ref.rollout.max_batch_size: a prompt's n samples decode together
    max_response_bytes: int = MAX_MESSAGE_BYTES  # the answer must fit in one gRPC message

    def check(self, batch, params: SamplingParams) -> None:
        longest = int(batch["attention_mask"].sum(-1).max())
        if longest + params.max_new_tokens > self.max_positions:
            raise InvalidArgument(f"sampling.max_new_tokens: a prompt of {longest} tokens + {params.max_new_tokens} "
                                  f"new tokens exceed the model's {self.max_positions} positions")
        if params.n > self.max_batch_size:
            raise ResourceExhausted(f"sampling.n: {params.n} samples of a prompt decode together; this rollout "
                                    f"decodes at most {self.max_batch_size} rows at once (rollout.max_batch_size)")
        width = batch["input_ids"].shape[1] + params.max_new_tokens
        size = len(batch) * params.n * width * BYTES_PER_OUTPUT_TOKEN
        if size > self.max_response_bytes:
            raise ResourceExhausted(f"sampling.n x max_new_tokens: {len(batch)} prompts x {params.n} samples of up to "
                                    f"{width} tokens answer ~{size / 2**20:.0f} MiB, over the "
                                    f"{self.max_response_bytes / 2**20:.0f} MiB message limit; send fewer rows")


class RolloutServicer:
    """receiver: the standalone rollout's WeightReceiver (tandem/weights/receiver.py); None for
    the colocated rollout, which serves the actor's own weights. limits: what one generation
    may ask for (None: only the sampling checks). kept: the colocated actor's KeptRows
    (services/actor/kept_rows.py), which keeps the rows of a generation that asks for it (`keep`)
    and queues its log-prob pass behind it; None: the request's `keep` is ignored."""

    def __init__(self, worker: RolloutFront, thread: WorkerThread, receiver=None,
                 limits: GenerationLimits | None = None, kept=None):
        self.worker = worker
        self.thread = thread
        self.receiver = receiver
        self.limits = limits
        self.kept = kept

    async def GenerateSequences(self, request, context):
        batch = codec.decode_batch(request.batch)
        schemas.check_prompts(batch, self.worker.vocab_size)
        params = sampling_from_proto(request.sampling, self.worker.vocab_size)
        if self.limits is not None:
            self.limits.check(batch, params)
        keep = None
        if self.kept is not None and request.HasField("keep"):
            k = request.keep
            keep = (k.calculate_entropy, k.with_reference, k.before_update)
        generation = self.thread.submit(self.worker.generate_sequences, batch, params)
        key = self.kept.queue_after(generation, params, keep) if keep is not None else ""
        try:
            out = await asyncio.wrap_future(generation)
        except GenerationAborted as e:
            raise Aborted(str(e)) from None
        return rollout_pb2.GenerateSequencesResponse(batch=codec.encode_batch(out), kept_rows=key)

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
                                               seconds=result.seconds, transfer_seconds=result.transfer_seconds,
                                               breakdown=result.breakdown, buffer_opened=result.opened)

    async def GetWeightsDigest(self, request, context):
        version, digests = await self._receiver().digest()
        return rollout_pb2.GetWeightsDigestResponse(weights_version=version, sha256=digests)
