"""ControllerService over a real in-process gRPC server: StreamEvents, the first server-streaming
RPC (tandem/rpc/server.py maps its errors like any other call's), from a step, after a seq,
and following a run until it ends; bad requests named; unknown runs NOT_FOUND."""
import asyncio
import threading
import time

import grpc
import pytest
from test_server_errors import running

from tandem.controller.service.client import event_dict
from tandem.controller.service.pool import ServicePool
from tandem.controller.service.queue import RunQueue
from tandem.controller.service.records import Records, RunRecord
from tandem.controller.service.servicer import SERVICE, ControllerServicer
from tandem.v1 import controller_pb2, controller_pb2_grpc


@pytest.fixture
def records(tmp_path):
    db = Records(str(tmp_path / "state"))
    db.add(RunRecord(id="r1", state="queued", config_yaml="{}", created=1.0, total_steps=3))
    db.set_state("r1", "running")
    db.metrics("r1", 1, {"critic/score/mean": 0.5})
    db.log("r1", 1, "step 1/3")
    return db


async def collect(stub, **request) -> list[dict]:
    return [event_dict(e) async for e in stub.StreamEvents(controller_pb2.StreamEventsRequest(**request))]


def test_stream_events(tmp_path, records):
    servicer = ControllerServicer(records, RunQueue(records, ServicePool(str(tmp_path / "state"))), None)

    async def main():
        async with running(tmp_path, [(SERVICE, servicer)]) as endpoint:
            async with grpc.aio.insecure_channel(endpoint) as channel:
                stub = controller_pb2_grpc.ControllerServiceStub(channel)
                events = await collect(stub, run_id="r1")
                assert [e["kind"] for e in events] == ["log", "state", "metrics", "log"]
                assert events[2]["body"] == {"critic/score/mean": 0.5}
                assert [e["seq"] for e in await collect(stub, run_id="r1", from_step=1)] == \
                    [e["seq"] for e in events[2:]]
                assert await collect(stub, run_id="r1", after_seq=events[-1]["seq"]) == []

                def finish():  # the run goes on in another thread while a follower waits
                    time.sleep(1.0)
                    records.metrics("r1", 2, {"critic/score/mean": 1.0})
                    records.set_state("r1", "succeeded")

                threading.Thread(target=finish).start()
                followed = await collect(stub, run_id="r1", after_seq=events[-1]["seq"], follow=True)
                assert [e["kind"] for e in followed] == ["metrics", "state"] and followed[-1]["body"] == "succeeded"

                for request, code, fragment in ((dict(run_id="nope"), grpc.StatusCode.NOT_FOUND, "nope"),
                                                (dict(run_id="r1", from_step=-1), grpc.StatusCode.INVALID_ARGUMENT,
                                                 "from_step")):
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        await collect(stub, **request)
                    assert e.value.code() == code and fragment in e.value.details()

    asyncio.run(main())
