"""The controller checks a reward service's answer as a service checks a request: one finite
score per row, else an error naming the service and the field `scores` (any reward service may
be someone else's code, tandem.v1.RewardService being the plug-in point)."""
import asyncio

import grpc
import pytest

from controller.clients import RewardClient
from tandem.data.batch import DataProto
from tandem.v1 import reward_pb2, reward_pb2_grpc

ROWS = DataProto(columns={"response_text": ["3", "4", "5"], "ground_truth": ["3", "4", "6"]})


class FixedAnswer(reward_pb2_grpc.RewardServiceServicer):
    """A reward service that answers the same scores whatever it is asked."""

    def __init__(self, scores):
        self.scores = scores

    async def Score(self, request, context):
        return reward_pb2.ScoreResponse(scores=self.scores)


def score_with(answer: list[float]) -> list[float]:
    async def main():
        server = grpc.aio.server()
        reward_pb2_grpc.add_RewardServiceServicer_to_server(FixedAnswer(answer), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        client = RewardClient(f"127.0.0.1:{port}", timeout_s=30)
        try:
            return await client.score(ROWS)
        finally:
            await client.close()
            await server.stop(0)

    return asyncio.run(main())


def test_one_finite_score_per_row_is_taken():
    assert score_with([1.0, 1.0, 0.0]) == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("answer", [[1.0, 0.0], [1.0, 0.0, 1.0, 1.0], []])
def test_wrong_number_of_scores_names_the_service_and_field(answer):
    with pytest.raises(ValueError, match=rf"RewardService\.Score at 127\.0\.0\.1:\d+ answered {len(answer)} values "
                                         r"in 'scores' for 3 rows"):
        score_with(answer)


def test_non_finite_scores_name_the_rows():
    with pytest.raises(ValueError, match=r"RewardService\.Score at .*: 'scores' of rows \[1, 2\] are not finite"):
        score_with([1.0, float("nan"), float("inf")])
