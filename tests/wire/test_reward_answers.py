"""The controller checks a reward service's answer as a service checks a request (any reward
service may be someone else's code, tandem.v1.RewardService being the plug-in point): one
finite score per row, else the rows fail, with reward_model.on_failure=fail an error naming the
service's endpoint and the field `scores` (controller/reward_calls.py)."""
import asyncio

import grpc
import pytest

from tandem.config import load_config
from tandem.controller.clients import RewardClient
from tandem.controller.reward_calls import RewardFailure, score_rows, settle
from tandem.data.batch import DataProto
from tandem.v1 import reward_pb2, reward_pb2_grpc

ROWS = DataProto(columns={"response_text": ["3", "4", "5"], "ground_truth": ["3", "4", "6"]})
CFG = load_config(None, ["reward_model.on_failure=fail", "reward_model.max_retries=0"])


class FixedAnswer(reward_pb2_grpc.RewardServiceServicer):
    """A reward service that answers the same scores whatever it is asked."""

    def __init__(self, scores):
        self.scores = scores

    async def Score(self, request, context):
        return reward_pb2.ScoreResponse(scores=self.scores)


def score_with(answer: list[float]) -> list[float]:
    """Score ROWS at a service answering `answer`, then apply on_failure=fail."""
    async def main():
        server = grpc.aio.server()
        reward_pb2_grpc.add_RewardServiceServicer_to_server(FixedAnswer(answer), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        client = RewardClient(f"127.0.0.1:{port}", timeout_s=30)
        try:
            return await score_rows(client, ROWS, CFG)
        finally:
            await client.close()
            await server.stop(0)

    scored = asyncio.run(main())
    assert settle(scored, group_size=1, cfg=CFG) is None  # raises when a row failed
    return scored.scores.tolist()


def test_one_finite_score_per_row_is_taken():
    assert score_with([1.0, 1.0, 0.0]) == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("answer", [[1.0, 0.0], [1.0, 0.0, 1.0, 1.0], []])
def test_wrong_number_of_scores_names_the_service_and_field(answer):
    with pytest.raises(RewardFailure, match=rf"3 of 3 rows could not be scored .*reward_model\.on_failure=fail.*"
                                            rf"the reward service at 127\.0\.0\.1:\d+ returned {len(answer)} values "
                                            r"in 'scores' for 3 rows"):
        score_with(answer)


def test_non_finite_scores_name_the_rows():
    with pytest.raises(RewardFailure, match=r"2 of 3 rows could not be scored .*row 1: the reward service returned "
                                            r"a non-finite score nan; row 2: .* inf"):
        score_with([1.0, float("nan"), float("inf")])
