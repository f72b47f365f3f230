"""controller/scoring.score decodes the responses in a worker thread: the event loop keeps serving the
step's other calls meanwhile (the log-prob call started beside scoring). A real reward server
(tests/helpers/faulty_reward_server.py, no fault: every row scores 1.0) and a tokenizer whose decoding
takes 0.5 s."""
import asyncio
import sys
import time

import torch
from server_process import ROOT, server_process

from tandem.config import load_config
from tandem.controller import scoring
from tandem.controller.clients import RewardClient
from tandem.data.batch import DataProto

SERVER = str(ROOT / "tests" / "helpers" / "faulty_reward_server.py")


class SlowTokenizer:
    """Decodes token ids as digits, taking 0.5 s a batch (a large batch on a busy CPU)."""
    def batch_decode(self, rows, skip_special_tokens=True):
        time.sleep(0.5)
        return ["".join(str(t % 10) for t in row) for row in rows]


def test_decoding_leaves_the_event_loop_free(tmp_path):
    mask = torch.tensor([[1, 0], [1, 1], [1, 1], [1, 0]])
    gen = DataProto(tensors={"responses": torch.tensor([[7, 3], [1, 2], [8, 0], [9, 9]]), "response_mask": mask,
                             "attention_mask": torch.cat([torch.ones(4, 1, dtype=mask.dtype), mask], 1)},  # a 1-token prompt
                    columns={"ground_truth": ["7", "12", "80", "9"], "data_source": ["t"] * 4})
    tokenizer = SlowTokenizer()
    cfg = load_config(None, ["reward_model.timeout_s=10"])

    async def main():
        ticks = []

        async def ticker():  # what the step's other calls need from the loop
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        async with RewardClient(endpoint, timeout_s=10) as client:
            tick = asyncio.ensure_future(ticker())
            await asyncio.sleep(0.05)
            t0 = time.monotonic()
            scored = await scoring.score(client, gen, tokenizer, cfg)
            tick.cancel()
            return scored, [t for t in ticks if t0 + 0.05 < t < t0 + 0.45], time.monotonic() - t0  # decoding

    port = tmp_path / "reward.port"
    with server_process([sys.executable, SERVER, "--port-file", str(port)], port) as endpoint:
        scored, ticks_during, took = asyncio.run(main())
    assert scored.scores.tolist() == [1.0] * 4 and not scored.failures
    assert took >= 0.5
    assert len(ticks_during) >= 10  # the loop ran while it decoded (0 when the decode holds it)
    assert tokenizer._tandem_thread_decoder is not tokenizer  # a copy decodes: the caller's stays unshared
    assert scoring.thread_decoder(tokenizer) is tokenizer._tandem_thread_decoder  # made once
