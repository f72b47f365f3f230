"""RewardService adapter: text columns (and, for a reward model, token ids) in, one score per
row out, plus the rows that could not be scored (never a made-up score)."""
from __future__ import annotations

from tandem.data import codec
from tandem.data.validate import check_rows, check_same_shape, check_token_range, require_column, require_tensor
from tandem.rpc.errors import InvalidArgument
from tandem.services.reward.scorer import Scorer
from tandem.serving.worker_thread import WorkerThread
from tandem.v1 import reward_pb2

SERVICE = "tandem.v1.RewardService"


class RewardServicer:
    def __init__(self, scorer: Scorer, thread: WorkerThread, vocab_size: int | None = None):
        self.scorer = scorer
        self.thread = thread
        self.vocab_size = vocab_size  # the reward model's, when there is one

    def _check_tokens(self, batch) -> None:
        require_tensor(batch, "input_ids", ndim=2)
        check_same_shape(batch, "input_ids", "attention_mask")
        check_token_range(batch, "input_ids", self.vocab_size)
        mask = batch["attention_mask"]
        if not bool(mask.bool().any(-1).all()):
            raise InvalidArgument("tensor 'attention_mask': every row needs at least one real token")

    async def Score(self, request, context):
        batch = codec.decode_batch(request.batch)
        check_rows(batch)
        require_column(batch, "response_text")
        require_column(batch, "ground_truth")
        for name in ("response_text", "ground_truth", "data_source", "prompt_text"):
            bad = [i for i, v in enumerate(batch.columns.get(name, [])) if not isinstance(v, str)]
            if bad:
                raise InvalidArgument(f"column '{name}': row {bad[0]} is not a string")
        if self.scorer.needs_tokens:
            self._check_tokens(batch)
        try:
            scored = await self.thread.run(self.scorer.score, batch)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        failures = [reward_pb2.RowFailure(row=row, reason=reason) for row, reason in sorted(scored.failures.items())]
        return reward_pb2.ScoreResponse(scores=scored.scores, failures=failures)
