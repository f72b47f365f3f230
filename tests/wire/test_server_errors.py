"""A real in-process grpc.aio server on port 0: health, size limits, error
statuses for bad input (with the field named), and recovery after each."""

import asyncio
import os
import random
import signal
import time

import grpc
import pytest
import structlog
import torch
from aio_server import serving

from tandem.data import codec, validate
from tandem.data.batch import DataProto
from tandem.rpc import errors
from tandem.rpc.client import ServiceClient, make_channel
from tandem.rpc.server import serve
from tandem.serving.worker_thread import WorkerThread
from tandem.v1 import critic_pb2, critic_pb2_grpc, reward_pb2, reward_pb2_grpc

REWARD = "tandem.v1.RewardService"


class LengthReward:
    """Score = len(response_text); echoes the batch back as `extra` when meta echo is set."""

    def __init__(self):
        self.worker = WorkerThread()

    async def Score(self, request, context):
        batch = codec.decode_batch(request.batch)
        texts = validate.require_column(batch, "response_text")
        if texts and texts[0] == "boom":
            raise RuntimeError("boom in the rule")
        if texts and texts[0] == "fatal":  # a BaseException on the worker thread (torch's CheckpointException is one)
            await self.worker.run(raise_fatal)
        if texts and texts[0] == "slow":  # blocking model work belongs on the worker thread
            method = await self.worker.run(slow_work, 0.5)
            return reward_pb2.ScoreResponse(scores=[float(method == "RewardService.Score")])
        extra = request.batch if batch.meta.get("echo") else None
        return reward_pb2.ScoreResponse(scores=[float(len(t)) for t in texts], extra=extra)


class Fatal(BaseException):
    """Not an Exception: grpc.aio's own handler would leave the call unanswered until its deadline."""


def raise_fatal():
    raise Fatal("the disk said no\n  (a traceback torch would append)")


def slow_work(seconds: float) -> str:
    time.sleep(seconds)
    return structlog.contextvars.get_contextvars()["method"]  # copied from the RPC's context


def running(tmp_path, servicers=None, **kw):
    """The reward servicer above (or `servicers`) served in process; yields the endpoint."""
    return serving(tmp_path, servicers or [(REWARD, LengthReward())], **kw)


def request(texts, **tensors) -> reward_pb2.ScoreRequest:
    b = DataProto(tensors=tensors, columns={"response_text": texts, "ground_truth": ["x"] * len(texts)})
    return reward_pb2.ScoreRequest(batch=codec.encode_batch(b))


async def assert_good_call(client):
    resp = await client.call("Score", request(["ab", "cde"]))
    assert list(resp.scores) == [2.0, 3.0]


def test_health_serving_and_score(tmp_path):
    async def main():
        servicers = [(REWARD, LengthReward()), ("tandem.v1.CriticService", object())]
        async with running(tmp_path, servicers) as ep:
            client = ServiceClient(ep, reward_pb2_grpc.RewardServiceStub, timeout_s=10,
                                   metadata={"run_id": "r1"})
            client.set_metadata(step=3)
            await client.wait_healthy(timeout_s=5)
            await client.wait_healthy(timeout_s=5, service=REWARD)
            await assert_good_call(client)
            critic = ServiceClient(ep, critic_pb2_grpc.CriticServiceStub, timeout_s=10)
            with pytest.raises(errors.TandemError, match="CriticService.ComputeValues: .*not implemented") as ei:
                await critic.call("ComputeValues", critic_pb2.ComputeValuesRequest())
            assert ei.value.code == grpc.StatusCode.UNIMPLEMENTED
            await critic.close()
            await client.close()
        # server gone: wait_healthy names the endpoint
        client = ServiceClient(ep, reward_pb2_grpc.RewardServiceStub)
        with pytest.raises(errors.Unavailable, match=f"RewardService at {ep} not SERVING"):
            await client.wait_healthy(timeout_s=0.3, poll_s=0.1)
        await client.close()
    asyncio.run(main())


def test_64mb_batch_round_trip_and_limits(tmp_path):
    async def main():
        rows = 4
        payload = torch.arange(rows * 4 * 1024 * 1024, dtype=torch.float32).reshape(rows, -1)  # 64 MiB
        async with running(tmp_path) as ep:
            client = ServiceClient(ep, reward_pb2_grpc.RewardServiceStub, timeout_s=60)
            req = request(["a", "bb", "ccc", "dddd"], payload=payload)
            req.batch.meta.update({"echo": True})
            resp = await client.call("Score", req)  # 64 MiB each way, above grpc's 4 MiB default
            assert list(resp.scores) == [1.0, 2.0, 3.0, 4.0]
            assert torch.equal(codec.decode_batch(resp.extra)["payload"], payload)
            await client.close()
        # a server with a 1 MiB limit refuses a 2 MiB request instead of taking it
        async with running(tmp_path, max_message_mb=1) as ep:
            client = ServiceClient(ep, reward_pb2_grpc.RewardServiceStub, timeout_s=10)
            with pytest.raises(errors.ResourceExhausted):
                await client.call("Score", request(["a"], payload=torch.zeros(1, 512 * 1024)))
            await assert_good_call(client)
            await client.close()
    asyncio.run(main())


def corrupt(req, fn):
    fn(req.batch)
    return req


BAD_REQUESTS = {
    "wrong byte length": (
        corrupt(request(["a", "b"], input_ids=torch.zeros(2, 4, dtype=torch.int64)),
                lambda b: setattr(b.tensors[0], "data", b"\0" * 24)),
        r"RewardService\.Score: tensor 'input_ids': 24 bytes do not match shape \[2, 4\] x int64 \(64 bytes\)"),
    "unknown dtype": (
        corrupt(request(["a", "b"], input_ids=torch.zeros(2, 4, dtype=torch.int64)),
                lambda b: setattr(b.tensors[0], "dtype", 99)),
        r"tensor 'input_ids': unknown dtype enum value 99"),
    "inconsistent rows": (
        corrupt(request(["a", "b"], input_ids=torch.zeros(2, 4, dtype=torch.int64)),
                lambda b: b.columns.add(name="prompt_text", values=["p"])),  # the encoder would refuse
        r"batch: tensor 'input_ids' has 2 rows but column 'prompt_text' has 1"),
    "bad json": (
        corrupt(request(["a"]), lambda b: b.columns.add(name="extra_info", values=["{nope"], json=True)),
        r"column 'extra_info': row 0 is not valid JSON"),
    "missing column": (
        reward_pb2.ScoreRequest(batch=codec.encode_batch(DataProto(columns={"ground_truth": ["1"]}))),
        r"missing column 'response_text'"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_is_invalid_argument_then_service_recovers(tmp_path, case):
    req, message = BAD_REQUESTS[case]

    async def main():
        async with running(tmp_path) as ep:
            client = ServiceClient(ep, reward_pb2_grpc.RewardServiceStub, timeout_s=10)
            with pytest.raises(errors.InvalidArgument, match=message) as ei:
                await client.call("Score", req)
            assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
            await assert_good_call(client)
            await client.close()
    asyncio.run(main())


def test_garbage_bytes_and_plain_exception(tmp_path):
    async def main():
        async with running(tmp_path) as ep:
            client = ServiceClient(ep, reward_pb2_grpc.RewardServiceStub, timeout_s=10)
            channel = make_channel(ep)
            raw = channel.unary_unary(f"/{REWARD}/Score", request_serializer=None, response_deserializer=None)
            # field 1 (batch) claims far more bytes than follow, then random noise
            garbage = b"\x0a\xff\xff\xff\x7f" + random.Random(0).randbytes(1000)
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await raw(garbage, timeout=10)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "request could not be parsed as tandem.v1.ScoreRequest" in ei.value.details()
            await assert_good_call(client)
            # a servicer bug: INTERNAL with the exception type, and the service lives on
            with pytest.raises(errors.Internal, match=r"RewardService\.Score: RuntimeError: boom in the rule"):
                await client.call("Score", request(["boom"]))
            await assert_good_call(client)
            await channel.close()
            await client.close()
    asyncio.run(main())


def test_a_base_exception_is_answered_at_once(tmp_path):
    async def main():
        async with running(tmp_path) as ep:
            client = ServiceClient(ep, reward_pb2_grpc.RewardServiceStub, timeout_s=30)
            t0 = time.perf_counter()
            with pytest.raises(errors.Internal) as ei:
                await client.call("Score", request(["fatal"]))
            assert time.perf_counter() - t0 < 5  # an answer, not the 30 s deadline
            assert str(ei.value) == "RewardService.Score: Fatal: the disk said no"  # its first line
            await assert_good_call(client)
            await client.close()
    asyncio.run(main())


def test_worker_thread_keeps_the_loop_free(tmp_path):
    async def main():
        async with running(tmp_path) as ep:
            client = ServiceClient(ep, reward_pb2_grpc.RewardServiceStub, timeout_s=10)
            slow = asyncio.create_task(client.call("Score", request(["slow"])))
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            await client.wait_healthy(timeout_s=2)
            await assert_good_call(client)  # answered while the worker sleeps
            assert time.perf_counter() - t0 < 0.3 and not slow.done()
            assert list((await slow).scores) == [1.0]  # worker saw the RPC's contextvars
            await client.close()
    asyncio.run(main())


def test_sigterm_stops_gracefully(tmp_path):
    port_file = tmp_path / "port"

    async def main():
        task = asyncio.create_task(serve([(REWARD, LengthReward())], role="test",
                                         port_file=str(port_file), grace_s=0.5))
        while not port_file.exists():
            await asyncio.sleep(0.01)
        client = ServiceClient(f"127.0.0.1:{int(port_file.read_text())}", reward_pb2_grpc.RewardServiceStub)
        await assert_good_call(client)
        os.kill(os.getpid(), signal.SIGTERM)  # handled by serve()'s loop signal handler
        await asyncio.wait_for(task, timeout=5)  # serve() returns on its own
        with pytest.raises(errors.Unavailable):
            await client.call("Score", request(["a"]), timeout_s=1)
        await client.close()
    asyncio.run(main())
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handler removed again


class Streamer:
    """ActorService.StreamWeights yielding two messages (one pre-serialized), then failing as asked."""

    def __init__(self):
        from tandem.weights import wire

        self.wire = wire

    async def StreamWeights(self, request, context):
        yield self.wire.end_message(1, 2)  # a message
        yield self.wire.chunk_message(7, [b"abc"])  # bytes the servicer framed itself
        if request.chunk_bytes == 1:
            raise errors.InvalidArgument("chunk_bytes: one is too few")
        if request.chunk_bytes == 2:
            raise RuntimeError("boom in the stream")


def test_server_streams_map_errors_after_their_messages(tmp_path):
    from tandem.v1 import weights_pb2
    from tandem.weights import wire

    async def read(endpoint, chunk_bytes):
        async with grpc.aio.insecure_channel(endpoint) as ch:
            call = ch.unary_stream("/tandem.v1.ActorService/StreamWeights",
                                   request_serializer=weights_pb2.StreamWeightsRequest.SerializeToString,
                                   response_deserializer=wire.parse_stream_message)
            got = []
            try:
                async for m in call(weights_pb2.StreamWeightsRequest(chunk_bytes=chunk_bytes), timeout=30):
                    got.append((m[0], m[1]))
            except grpc.aio.AioRpcError as e:
                return got, e.code(), e.details()
            return got, grpc.StatusCode.OK, ""

    async def main():
        async with running(tmp_path, [("tandem.v1.ActorService", Streamer())]) as endpoint:
            first = [("end", 1), ("chunk", 7)]
            assert await read(endpoint, 3) == (first, grpc.StatusCode.OK, "")
            assert await read(endpoint, 1) == (first, grpc.StatusCode.INVALID_ARGUMENT, "chunk_bytes: one is too few")
            got, code, details = await read(endpoint, 2)
            assert (got, code) == (first, grpc.StatusCode.INTERNAL) and "RuntimeError: boom in the stream" in details
            async with grpc.aio.insecure_channel(endpoint) as ch:  # garbage request bytes
                call = ch.unary_stream("/tandem.v1.ActorService/StreamWeights")
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    async for _ in call(b"\x07garbage", timeout=30):
                        pass
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "StreamWeightsRequest" in e.value.details()
            assert await read(endpoint, 3) == (first, grpc.StatusCode.OK, "")  # and it still serves

    asyncio.run(main())
