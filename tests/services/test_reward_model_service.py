"""The reward service hosting a reward model (reward_model.enable), as a real process over gRPC:
its scores are transformers' LlamaForSequenceClassification logits plus rule_coef x the rule's
score; bad token batches are INVALID_ARGUMENT naming the tensor and leave it serving."""
import asyncio
import sys

import grpc
import pytest
import torch
from server_process import server_process
from tiny_hf import tiny_reward_model

from tandem.controller.clients import RewardClient
from tandem.data.batch import DataProto
from tandem.rpc.errors import TandemError

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("ranks", [1, 2])
def test_reward_model_service_scores_and_refuses_bad_tokens(tmp_path, ranks):
    """ranks=2: the reward model at tensor parallelism 2 (two rank processes, gloo): the same scores."""
    from transformers import AutoModelForSequenceClassification

    rm = tiny_reward_model(tmp_path / "rm", "qwen2")
    hf = AutoModelForSequenceClassification.from_pretrained(rm, dtype=torch.float32, attn_implementation="eager")
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 0], [0, 9, 10, 11, 12, 13, 14], [3, 4, 5, 6, 7, 0, 0]])
    mask = (torch.arange(7) >= torch.tensor([2, 1, 0])[:, None]) & (torch.arange(7) < torch.tensor([6, 7, 5])[:, None])
    with torch.no_grad():
        want = torch.stack([hf(ids[i][mask[i]][None]).logits[0, 0] for i in range(3)])
    rule = torch.tensor([1.0, 0.0, 1.0])  # exact match of response_text and ground_truth
    batch = DataProto(tensors={"input_ids": ids, "attention_mask": mask.long()},
                      columns={"response_text": ["7", "8", "9"], "ground_truth": ["7", "9", "9"]})
    cmd = [sys.executable, "-m", "tandem.services.reward", "--port-file", str(tmp_path / "port"),
           "reward_model.enable=true", f"reward_model.model.path={rm}", "reward_model.micro_batch_size_per_gpu=2",
           "reward_model.rule_coef=0.5"]
    if ranks == 2:
        cmd += ["services.reward.world_size=2", "reward_model.megatron.tensor_model_parallel_size=2"]

    async def expect_invalid(client, bad, *fragments):
        try:
            await client.score(bad)
        except TandemError as e:
            assert e.code == INVALID and all(f in str(e) for f in fragments), str(e)
        else:
            raise AssertionError(f"accepted a bad batch; expected {fragments}")

    async def main(endpoint):
        async with RewardClient(endpoint, timeout_s=120) as client:
            got = torch.tensor(await client.score(batch))
            torch.testing.assert_close(got, want + 0.5 * rule, atol=1e-4, rtol=0)
            oov = ids.clone()
            oov[1, 3] = 128
            cases = [(DataProto(columns=batch.columns), ("missing tensor 'input_ids'",)),
                     (DataProto(tensors={"input_ids": oov, "attention_mask": mask.long()}, columns=batch.columns),
                      ("'input_ids'", "token id 128 out of vocabulary [0, 128)")),
                     (DataProto(tensors={"input_ids": ids, "attention_mask": mask[:, :5].long()},
                                columns=batch.columns), ("'attention_mask'", "shape")),
                     (DataProto(tensors={"input_ids": ids, "attention_mask": torch.zeros_like(ids)},
                                columns=batch.columns), ("every row needs at least one real token",))]
            for bad, fragments in cases:
                await expect_invalid(client, bad, *fragments)
                torch.testing.assert_close(torch.tensor(await client.score(batch)), got, atol=0, rtol=0)

    with server_process(cmd, tmp_path / "port", timeout_s=180) as endpoint:
        asyncio.run(main(endpoint))
