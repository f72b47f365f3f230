"""Measured call deadlines (tandem/rpc/deadlines.py): the work a request carries, deadlines from the
rates of earlier calls (first calls of a process on the configured timeout), the calls in flight
ahead of one, and a real client whose call to a real in-process server runs past its measured
deadline while the server's health still answers: the call fails DEADLINE_EXCEEDED, and the
record names the call, its deadline and what was expected."""
import asyncio
import time

import pytest
import torch
from aio_server import serving
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.data import codec
from tandem.data.batch import DataProto
from tandem.rpc import errors
from tandem.rpc.client import ServiceClient
from tandem.rpc.deadlines import CallDeadlines, work_of
from tandem.v1 import actor_pb2, common_pb2, reward_pb2, reward_pb2_grpc, rollout_pb2

REWARD = "tandem.v1.RewardService"


def batch(rows: int, tokens: int) -> DataProto:
    return DataProto(tensors={"input_ids": torch.zeros(rows, tokens, dtype=torch.int64),
                              "lengths": torch.zeros(rows, dtype=torch.int64)}, columns={"tag": ["x"] * rows})


def test_work_is_the_largest_tensor_times_samples_per_prompt():
    generate = rollout_pb2.GenerateSequencesRequest(batch=codec.encode_batch(batch(4, 10)),
                                                    sampling=rollout_pb2.SamplingParams(n=3, max_new_tokens=8))
    assert work_of(generate) == 4 * 10 * 3
    update = actor_pb2.UpdateActorRequest(rows=actor_pb2.Rows(kept=actor_pb2.KeptRows(key="k", rows=[0, 1])),
                                          batch=codec.encode_batch(batch(2, 6)))
    assert work_of(update) == 2 * 6  # a tensor nested in the request counts; kept rows carry none
    log_probs = actor_pb2.ComputeLogProbRequest(rows=actor_pb2.Rows(batch=codec.encode_batch(batch(5, 7))))
    assert work_of(log_probs) == 5 * 7
    assert work_of(common_pb2.SaveCheckpointRequest(path="/x")) == 1.0  # no tensor: one unit


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed(deadlines: CallDeadlines, clock: Clock, method: str, request, seconds: float, configured_s=600.0):
    """One call of `seconds` that succeeds -> the deadline it had."""
    call = deadlines.start(method, request, configured_s)
    clock.now += seconds
    deadlines.finish(call, ok=True)
    return call.deadline_s


def logprobs(rows: int):
    return actor_pb2.ComputeLogProbRequest(rows=actor_pb2.Rows(batch=codec.encode_batch(batch(rows, 10))))


def test_deadlines_from_measured_rates_scale_with_the_work():
    clock = Clock()
    d = CallDeadlines(clock)
    m = "ActorService.ComputeLogProb"
    assert timed(d, clock, m, logprobs(4), 50.0) == 600.0  # first call of the process: warm-up, not measured
    assert timed(d, clock, m, logprobs(4), 8.0) == 600.0  # nothing measured yet; this one is (8 s / 40 units)
    assert d.start(m, logprobs(4), 600.0).deadline_s == pytest.approx(10 * 8.0)
    d = CallDeadlines(clock)
    for seconds in (1.0, 1.0, 12.0):  # warm-up, then 1 s per 40 units, then 12 s per 80 units
        timed(d, clock, m, logprobs(4 if seconds < 12 else 8), seconds)
    expected = 12.0 / 80 * 160  # the slowest recent rate, times this call's work
    call = d.start(m, logprobs(16), 600.0)
    assert (call.deadline_s, call.expected_s) == pytest.approx((10 * expected, expected))
    d.finish(call, ok=False)  # a failed call is not measured
    # a call waits behind the calls in flight on the same service: their deadlines are added
    other = d.start(m, logprobs(4), 600.0)
    behind = d.start(m, logprobs(4), 600.0)
    assert behind.deadline_s == pytest.approx(other.deadline_s + 10 * 12.0 / 80 * 40)
    for c in (other, behind):
        d.finish(c, ok=False)
    # the floor (a tenth of the configured timeout) and the cap (the configured timeout)
    for rows, deadline_s in ((1, 60.0), (1000, 600.0)):
        call = d.start(m, logprobs(rows), 600.0)
        assert call.deadline_s == deadline_s
        d.finish(call, ok=False)
    # not a step's call (a checkpoint load may wait on disk or a save in flight): never measured
    load = common_pb2.LoadCheckpointRequest()
    for _ in range(3):
        assert timed(d, clock, "ActorService.LoadCheckpoint", load, 0.01) == 600.0


def test_a_restarted_process_warms_up_again_and_a_late_call_is_recorded():
    clock = Clock()
    d = CallDeadlines(clock)
    m = "ActorService.UpdateActor"
    for _ in range(3):
        timed(d, clock, m, logprobs(4), 2.0)
    late = d.start(m, logprobs(4), 600.0)
    assert late.deadline_s == 60.0
    clock.now += late.deadline_s
    d.finish(late, ok=False, late=True)
    assert d.overdue.describe() == "did not answer ActorService.UpdateActor within 60 s (expected ~2 s)"
    recorded = d.overdue
    early = d.start(m, logprobs(4), 600.0)
    clock.now += 1.0
    d.finish(early, ok=False, late=True)  # DEADLINE_EXCEEDED long before ours: the service's own, not a hang
    assert d.overdue is recorded
    d.process_restarted()
    assert d.overdue is None
    assert timed(d, clock, m, logprobs(4), 30.0) == 600.0  # its first call again, not measured
    assert d.start(m, logprobs(4), 600.0).deadline_s == 60.0  # the rates measured before stay


class SleepyReward:
    """Score sleeps as long as its first row's text says, on the event loop's executor."""

    async def Score(self, request, context):
        texts = list(codec.decode_batch(request.batch).columns["response_text"])
        await asyncio.get_running_loop().run_in_executor(None, time.sleep, float(texts[0]))
        return reward_pb2.ScoreResponse(scores=[0.0] * len(texts))


def score(seconds: float) -> reward_pb2.ScoreRequest:
    return reward_pb2.ScoreRequest(batch=codec.encode_batch(DataProto(columns={"response_text": [str(seconds)]})))


def test_a_call_past_its_measured_deadline_fails_while_health_answers(tmp_path):
    async def main():
        async with serving(tmp_path, [(REWARD, SleepyReward())]) as ep:
            client = ServiceClient(ep, reward_pb2_grpc.RewardServiceStub, timeout_s=5.0)
            client.deadlines = CallDeadlines(measured={"RewardService.Score"})
            for _ in range(3):  # warm-up, then measured (~0.01 s each)
                await client.call("Score", score(0.01))
            t0 = time.monotonic()
            with pytest.raises(errors.DeadlineExceeded, match="RewardService.Score"):
                await client.call("Score", score(1.5))  # its deadline: the floor, 0.5 s
            assert 0.4 < time.monotonic() - t0 < 2.0
            late = client.deadlines.overdue
            assert late.method == "RewardService.Score" and late.deadline_s == pytest.approx(0.5)
            assert late.describe().startswith("did not answer RewardService.Score within 0.5 s (expected ~0.0")
            reply = await health_pb2_grpc.HealthStub(client.channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING  # hung on the call, not dead
            with pytest.raises(errors.DeadlineExceeded):  # a caller's own timeout wins over the measured one
                await client.call("Score", score(1.0), timeout_s=0.2)
            assert client.deadlines.overdue is late  # not ours: not recorded
            await client.repoint(ep)  # a restarted service: its first call gets the configured timeout again
            assert client.deadlines.overdue is None
            await client.call("Score", score(1.0))
            await client.close()
    asyncio.run(main())
