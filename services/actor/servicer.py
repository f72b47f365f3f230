"""ActorService adapter: decode, validate, call the ActorWorker on its thread, encode.

The weight-plane RPCs (a rollout pulling the policy) come from WeightSourceServicer, over a
WeightSource that exports on the worker thread and sends from its own threads.
"""
from __future__ import annotations

from tandem.data import codec, schemas
from tandem.data.batch import DataProto
from tandem.rpc.errors import FailedPrecondition, InvalidArgument
from tandem.services.actor.front import ActorFront
from tandem.services.actor.kept_rows import KeptRows
from tandem.serving import checkpoint_requests
from tandem.serving.worker_thread import WorkerThread
from tandem.v1 import actor_pb2, common_pb2
from tandem.weights.source import WeightSource
from tandem.weights.source_servicer import WeightSourceServicer

SERVICE = "tandem.v1.ActorService"
UPDATE_KEYS = ("advantages", "old_log_probs", "ref_log_prob", "rollout_log_probs")  # UpdateActor's batch
KEPT_UPDATE_KEYS = ("advantages", "rollout_log_probs")  # ... with kept rows


class ActorServicer(WeightSourceServicer):
    """kept: the colocated rollout's KeptRows (rows.kept in calls); None without one."""

    def __init__(self, worker: ActorFront, thread: WorkerThread, kept: KeptRows | None = None):
        self.worker = worker
        self.thread = thread
        self.kept = kept

        def take():  # on the worker thread: no update can run between these reads and the export
            return worker.weights_version, worker.mutations, worker.stage_export()

        self.weights = WeightSource(take, thread.run, lambda: worker.mutations,
                                    store_hosts=worker.cfg.actor_rollout_ref.rollout.weight_sync.store_hosts)

    def _decode(self, batch_msg, float_keys=()):
        batch = codec.decode_batch(batch_msg)
        schemas.check_sequences(batch, self.worker.vocab_size, float_keys)
        schemas.check_meta(batch)
        return batch

    def _source(self, rows) -> str:
        """Which of Rows' oneof is set; INVALID_ARGUMENT for neither, FAILED_PRECONDITION for kept
        rows on an actor that keeps none."""
        which = rows.WhichOneof("source")
        if which is None:
            raise InvalidArgument("rows: send the rows (rows.batch) or name rows this actor kept (rows.kept)")
        if which == "kept" and self.kept is None:
            raise FailedPrecondition("rows.kept: this actor has no colocated rollout, so it keeps no rows")
        return which

    async def ComputeLogProb(self, request, context):
        settings = (request.calculate_entropy, request.with_reference, request.before_update)
        if self._source(request.rows) == "kept":
            out, skip = await self.kept.log_probs(request.rows.kept.key, list(request.rows.kept.rows), settings)
        else:
            batch = self._decode(request.rows.batch)
            out, skip = await self.thread.run(self.worker.log_probs, batch, *settings)
        return actor_pb2.ComputeLogProbResponse(batch=codec.encode_batch(out), update_rows=skip)

    def _update_keys(self) -> tuple[str, ...]:
        a = self.worker.actor_cfg
        return ("advantages",) + (("ref_log_prob",) if a.use_kl_loss else ()) + \
            (("rollout_log_probs",) if a.tis_imp_ratio_cap > 0 else ())

    async def UpdateActor(self, request, context):
        keys = self._update_keys()
        if self._source(request.rows) == "kept":
            return await self._update_kept(request, keys)
        rows = self._decode(request.rows.batch)
        sent = codec.decode_batch(request.batch)
        unknown = sorted(set(sent.tensors) - set(UPDATE_KEYS))
        if unknown:
            raise InvalidArgument(f"batch: carries {unknown}; it carries per-row {', '.join(UPDATE_KEYS)} only "
                                  "(the rows themselves go in rows.batch)")
        if sent.tensors and len(sent) != len(rows):
            raise InvalidArgument(f"batch: {len(sent)} rows for the {len(rows)} rows sent")
        batch = DataProto(tensors={**rows.tensors, **sent.tensors}, meta=rows.meta)
        own = self.worker.check_update(batch)  # before the worker thread: a bad request changes nothing
        schemas.check_floats(batch, keys + (("old_log_probs",) if own < len(batch) else ()))
        self._writes()
        metrics, old, own = await self.thread.run(self.worker.update_actor, batch)
        return self._updated(metrics, old, own)

    def _updated(self, metrics, old, own) -> actor_pb2.UpdateActorResponse:
        out = actor_pb2.UpdateActorResponse(metrics=metrics, weights_version=self.worker.weights_version,
                                            update_rows=own)
        if old is not None:
            out.batch.CopyFrom(codec.encode_batch(old))
        return out

    async def _update_kept(self, request, keys: tuple[str, ...]):
        """UpdateActor on the rows the colocated rollout kept: the batch is put together, checked and
        trained on in one worker call queued behind the kept log-prob pass (no GPU gap after it)."""
        sent = codec.decode_batch(request.batch)
        extra = sorted(set(sent.tensors) - set(KEPT_UPDATE_KEYS))
        if extra:
            raise InvalidArgument(f"batch: carries {extra}; with kept rows it carries only "
                                  f"{', '.join(KEPT_UPDATE_KEYS)} (the actor has the rest)")
        reference = "ref_log_prob" in keys
        kept, index = await self.kept.for_update(request.rows.kept.key, list(request.rows.kept.rows), sent,
                                                 reference)  # counts this update

        def update():
            batch = self.kept.update_batch(kept, index, sent, reference)
            schemas.check_floats(batch, keys)  # the rows are this actor's own generation: checked when made
            return self.worker.update_actor(batch)  # checks before it changes anything

        return self._updated(*await self.thread.run(update))

    def _writes(self) -> None:
        """A call that changes the policy or the reference arrived: a kept pass queued before it is stale."""
        if self.kept is not None:
            self.kept.wrote()

    async def TrainSft(self, request, context):
        self._writes()
        batch = codec.decode_batch(request.batch)
        schemas.check_sft(batch, self.worker.vocab_size)
        metrics = await self.thread.run(self.worker.train_sft, batch)
        return actor_pb2.TrainSftResponse(metrics=metrics, weights_version=self.worker.weights_version)

    async def SetReference(self, request, context):
        self._writes()
        await self.thread.run(self.worker.set_reference)
        return actor_pb2.SetReferenceResponse()

    async def SaveCheckpoint(self, request, context):
        path = await self.thread.run(self.worker.save, checkpoint_requests.save_path(request.path))
        return common_pb2.SaveCheckpointResponse(path=path)

    async def LoadCheckpoint(self, request, context):
        if request.trunk_only:
            raise InvalidArgument("trunk_only: only the critic loads a trunk")
        self._writes()
        path = checkpoint_requests.load_path(request.path)
        try:
            version = await self.thread.run(self.worker.load, path)
        except checkpoint_requests.LOAD_ERRORS as e:
            raise FailedPrecondition(f"path: {path!r} is not an actor checkpoint of this model: {e}") from None
        return common_pb2.LoadCheckpointResponse(weights_version=version)
