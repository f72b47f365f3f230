"""ActorService adapter: decode, validate, call the ActorWorker on its thread, encode.

The weight-plane RPCs (a rollout pulling the policy) come from WeightSourceServicer, over a
WeightSource that exports on the worker thread and sends from its own threads.
"""
from __future__ import annotations

from tandem.data import codec, schemas
from tandem.rpc.errors import FailedPrecondition, InvalidArgument
from tandem.services.actor.front import ActorFront
from tandem.services.actor.kept_rows import KeptRows
from tandem.serving import checkpoint_requests
from tandem.serving.worker_thread import WorkerThread
from tandem.v1 import actor_pb2, common_pb2
from tandem.weights.source import WeightSource
from tandem.weights.source_servicer import WeightSourceServicer

SERVICE = "tandem.v1.ActorService"
UPDATE_KEYS = ("old_log_probs", "advantages")
ON_POLICY_KEYS = ("advantages",)
KEPT_UPDATE_KEYS = ("kept_row", "advantages", "rollout_log_probs")  # UpdateActor(kept_rows)'s batch


class ActorServicer(WeightSourceServicer):
    """kept: the colocated rollout's KeptRows (ComputeLogProb's kept_rows); None without one."""

    def __init__(self, worker: ActorFront, thread: WorkerThread, kept: KeptRows | None = None):
        self.worker = worker
        self.thread = thread
        self.kept = kept

        def take():  # on the worker thread: no update can run between these reads and the export
            return worker.weights_version, worker.mutations, worker.stage_export()

        self.weights = WeightSource(take, thread.run, lambda: worker.mutations,
                                    store_hosts=worker.cfg.actor_rollout_ref.rollout.weight_sync.store_hosts)

    def _decode(self, request, float_keys=()):
        batch = codec.decode_batch(request.batch)
        schemas.check_sequences(batch, self.worker.vocab_size, float_keys)
        schemas.check_meta(batch)
        return batch

    async def ComputeLogProb(self, request, context):
        settings = (request.calculate_entropy, request.with_reference, request.policy_from_row)
        if request.kept_rows:
            if request.HasField("batch"):
                raise InvalidArgument("kept_rows: send either the batch or the key of kept rows, not both")
            if self.kept is None:
                raise FailedPrecondition("kept_rows: this actor has no colocated rollout, so it keeps no rows; "
                                         "send the batch")
            out = await self.kept.log_probs(request.kept_rows, settings)
            return actor_pb2.ComputeLogProbResponse(batch=codec.encode_batch(out))
        batch = self._decode(request)
        out = await self.thread.run(self.worker.compute_log_prob, batch, *settings)
        return actor_pb2.ComputeLogProbResponse(batch=codec.encode_batch(out))

    async def ComputeRefLogProb(self, request, context):
        batch = self._decode(request)
        out = await self.thread.run(self.worker.compute_ref_log_prob, batch)
        return actor_pb2.ComputeRefLogProbResponse(batch=codec.encode_batch(out))

    async def UpdateActor(self, request, context):
        # on_policy: old_log_probs come from the update (every row's, or with on_policy_rows the first rows')
        whole = request.on_policy and not request.on_policy_rows
        keys = ON_POLICY_KEYS if whole else UPDATE_KEYS
        keys += ("ref_log_prob",) if self.worker.actor_cfg.use_kl_loss else ()
        keys += ("rollout_log_probs",) if self.worker.actor_cfg.tis_imp_ratio_cap > 0 else ()
        if request.on_policy_rows and not request.on_policy:
            raise InvalidArgument("on_policy_rows: set only with on_policy")
        if request.kept_rows:
            return await self._update_kept(request, keys)
        self._writes()
        batch = self._decode(request, keys)
        if not request.on_policy:
            metrics = await self.thread.run(self.worker.update_actor, batch)
            return actor_pb2.UpdateActorResponse(metrics=metrics, weights_version=self.worker.weights_version)
        if whole and "old_log_probs" in batch.tensors:
            raise InvalidArgument("on_policy: the batch carries old_log_probs; the update computes them itself")
        rows = request.on_policy_rows
        self.worker.check_on_policy(batch, rows)  # before the worker thread: a bad request changes nothing
        metrics, old = await self.thread.run(self.worker.update_actor_on_policy, batch, rows)
        return actor_pb2.UpdateActorResponse(metrics=metrics, weights_version=self.worker.weights_version,
                                             batch=codec.encode_batch(old))

    async def _update_kept(self, request, keys: tuple[str, ...]):
        """UpdateActor on the rows the colocated rollout kept: the batch is put together, checked and
        trained on in one worker call queued behind the kept log-prob pass (no GPU gap after it)."""
        if self.kept is None:
            raise FailedPrecondition("kept_rows: this actor has no colocated rollout, so it keeps no rows; "
                                     "send the batch")
        sent = codec.decode_batch(request.batch)
        extra = sorted(set(sent.tensors) - set(KEPT_UPDATE_KEYS))
        if extra:
            raise InvalidArgument(f"kept_rows: the batch carries {extra}; with kept rows it carries only "
                                  f"{', '.join(KEPT_UPDATE_KEYS)} (the actor has the rest)")
        on_policy_rows = request.on_policy_rows if request.on_policy else None
        reference = "ref_log_prob" in keys
        kept = await self.kept.for_update(request.kept_rows, sent, on_policy_rows, reference)  # counts this update

        def update():
            batch = self.kept.update_batch(kept, sent, on_policy_rows, reference)
            schemas.check_floats(batch, keys)  # the rows are this actor's own generation: checked when made
            if on_policy_rows is None:
                return self.worker.update_actor(batch), None
            return self.worker.update_actor_on_policy(batch, on_policy_rows)  # checks before it changes anything

        metrics, old = await self.thread.run(update)
        out = actor_pb2.UpdateActorResponse(metrics=metrics, weights_version=self.worker.weights_version)
        if old is not None:
            out.batch.CopyFrom(codec.encode_batch(old))
        return out

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
