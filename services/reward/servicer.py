"""RewardService adapter: text columns in, one score per row out."""
from __future__ import annotations

from services.reward.worker import RewardWorker
from tandem.data import codec
from tandem.data.validate import check_rows, require_column
from tandem.rpc.errors import InvalidArgument
from tandem.serving.worker_thread import WorkerThread
from tandem.v1 import reward_pb2

SERVICE = "tandem.v1.RewardService"


class RewardServicer:
    def __init__(self, worker: RewardWorker, thread: WorkerThread):
        self.worker = worker
        self.thread = thread

    async def Score(self, request, context):
        batch = codec.decode_batch(request.batch)
        check_rows(batch)
        kwargs = {"response_text": require_column(batch, "response_text"),
                  "ground_truth": require_column(batch, "ground_truth")}
        for name in ("data_source", "extra_info", "prompt_text"):
            if name in batch.columns:
                kwargs[name] = batch.columns[name]
        for name in ("response_text", "ground_truth", "data_source", "prompt_text"):
            bad = [i for i, v in enumerate(kwargs.get(name, [])) if not isinstance(v, str)]
            if bad:
                raise InvalidArgument(f"column '{name}': row {bad[0]} is not a string")
        try:
            scores = await self.thread.run(self.worker.score, **kwargs)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        return reward_pb2.ScoreResponse(scores=scores)
