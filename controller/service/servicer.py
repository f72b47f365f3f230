"""ControllerService adapter: submissions, records, cancellation and event streams over gRPC.

The only controller-service file that knows the generated tandem.v1 messages (with the
CLI's client, controller/service/client.py).
"""
from __future__ import annotations

import asyncio
import json

from tandem.config import ConfigError
from tandem.controller.service.pool import ServicePool
from tandem.controller.service.queue import RunQueue
from tandem.controller.service.records import Event, Records, RunRecord
from tandem.controller.service.submit import new_record
from tandem.logging import get_logger
from tandem.rpc.errors import InvalidArgument, NotFound
from tandem.v1 import controller_pb2

SERVICE = "tandem.v1.ControllerService"
POLL_S = 0.5  # how often a following stream looks for new events
_log = get_logger("controller.service.servicer")


def record_to_proto(r: RunRecord) -> controller_pb2.RunRecord:
    return controller_pb2.RunRecord(
        id=r.id, state=r.state, source=r.source, overrides=r.overrides, config_yaml=r.config_yaml,
        created=r.created, started=r.started, finished=r.finished, run_dir=r.run_dir, last_step=r.last_step,
        total_steps=r.total_steps, summary_json=r.summary_json, error=r.error, cancel_requested=r.cancel_requested,
        resumed_from=r.resumed_from, experiment=r.experiment, service_pids_json=r.service_pids_json)


def event_to_proto(e: Event) -> controller_pb2.RunEvent:
    out = controller_pb2.RunEvent(seq=e.seq, step=e.step, time=e.time)
    if e.kind == "metrics":
        out.metrics.values.update(json.loads(e.body))
    elif e.kind == "state":
        out.state = e.body
    else:
        out.log = e.body
    return out


class ControllerServicer:
    def __init__(self, records: Records, queue: RunQueue, pool: ServicePool):
        self.records, self.queue, self.pool = records, queue, pool

    def _get(self, run_id: str) -> RunRecord:
        record = self.records.get(run_id) if run_id else None
        if record is None:
            raise NotFound(f"run_id: no run {run_id!r}")
        return record

    async def SubmitRun(self, request, context):
        try:
            record = new_record(request.config_yaml, list(request.overrides), request.source,
                                allow_dirs=self.queue.pool.allow_dirs)
        except ConfigError as e:
            raise InvalidArgument(str(e)) from None
        self.records.add(record)
        self.queue.wake()
        return controller_pb2.SubmitRunResponse(run=record_to_proto(record))

    async def GetRun(self, request, context):
        record = self._get(request.run_id)
        _, latest = self.records.latest_metrics(record.id)
        return controller_pb2.GetRunResponse(run=record_to_proto(record), latest_metrics=latest)

    async def ListRuns(self, request, context):
        if request.limit < 0:
            raise InvalidArgument(f"limit: must be >= 0, got {request.limit}")
        return controller_pb2.ListRunsResponse(runs=[record_to_proto(r) for r in self.records.list(request.limit)])

    async def CancelRun(self, request, context):
        self._get(request.run_id)
        record = self.queue.cancel(request.run_id)
        if record.state == "running":
            try:  # cut a generation in progress; the run itself stops at its next safe point
                await self.pool.interrupt(record.id)
            except Exception as e:  # noqa: BLE001 - the run still stops between steps
                _log.warning("cancel.interrupt_failed", run=record.id, error=str(e))
        return controller_pb2.CancelRunResponse(run=record_to_proto(record))

    async def StreamEvents(self, request, context):
        run_id = self._get(request.run_id).id
        if request.from_step < 0 or request.after_seq < 0:
            raise InvalidArgument("from_step, after_seq: must be >= 0")
        after = request.after_seq
        while True:
            ended = self.records.get(run_id).ended  # before the read: no event can follow the last one then
            events = self.records.events(run_id, request.from_step, after)
            for e in events:
                yield event_to_proto(e)
                after = e.seq
            if events:
                continue
            if not request.follow or ended:
                return
            await asyncio.sleep(POLL_S)
