"""The reward model: a Hugging Face XForSequenceClassification checkpoint loaded into megatron-core
(tandem/models/scalar_head.py + the registry's sequence-classification table) scores each row as
transformers does, at its last non-pad token: fp32 on CPU within 1e-4, through the reward
service's own worker (packed rows, Tandem's [left-padded prompt | right-padded response] layout)."""
import pytest
import torch
from tiny_hf import tiny_reward_model

from tandem.config import load_config
from tandem.data.batch import DataProto


def _rows(vocab: int, pad: int):
    """Rows of different lengths, one ending in pad_token_id tokens (EOS == pad, as in many
    tokenizers: transformers then reads the token before), as token lists."""
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in (5, 9, 12, 7)]
    rows[3] = rows[3] + [pad, pad]
    return rows


def _tandem_layout(rows, prompt_lens, pad):
    """[left-padded prompt | right-padded response] and its attention mask."""
    p_w = max(prompt_lens)
    r_w = max(len(r) - p for r, p in zip(rows, prompt_lens))
    ids = torch.full((len(rows), p_w + r_w), pad)
    mask = torch.zeros_like(ids)
    for i, (row, p) in enumerate(zip(rows, prompt_lens)):
        prompt, response = row[:p], row[p:]
        ids[i, p_w - p:p_w] = torch.tensor(prompt)
        ids[i, p_w:p_w + len(response)] = torch.tensor(response)
        mask[i, p_w - p:p_w + len(response)] = 1
    return ids, mask


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_scores_match_transformers(megatron_dist, tmp_path, family):
    from transformers import AutoModelForSequenceClassification

    from tandem.services.reward.model import RewardModelWorker

    path = tiny_reward_model(tmp_path / family, family)
    hf = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    pad = hf.config.pad_token_id
    rows = _rows(hf.config.vocab_size, pad)
    width = max(map(len, rows))  # transformers: right padding, its own last-non-pad rule
    right = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    real = (torch.arange(width) < torch.tensor([len(r) for r in rows])[:, None]).long()
    with torch.no_grad():
        want = hf(right, attention_mask=real).logits.squeeze(-1)

    cfg = load_config(None, ["reward_model.enable=true", f"reward_model.model.path={path}",
                             "reward_model.micro_batch_size_per_gpu=3"])
    worker = RewardModelWorker(cfg)
    ids, mask = _tandem_layout(rows, [2, 4, 6, 3], pad)
    (out,) = worker.scores([DataProto(tensors={"input_ids": ids, "attention_mask": mask})], micro_rows=3)
    got = out["rm_scores"]
    assert got.shape == (len(rows),) and got.dtype == torch.float32
    assert want.std() > 0.05  # rows score differently: a misplaced read would show
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_last_token_index_follows_transformers():
    from tandem.models.scalar_head import last_token_index

    ids = torch.tensor([[0, 5, 6, 0, 0], [0, 0, 7, 8, 9], [0, 4, 0, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    # row 0: a real token equal to pad (an EOS that is also pad) is skipped; row 2: a real pad at 0
    assert last_token_index(ids, mask, pad_token_id=0).tolist() == [2, 4, 1]
    assert last_token_index(ids, mask, pad_token_id=None).tolist() == [3, 4, 3]
    assert last_token_index(torch.zeros(1, 3, dtype=torch.long), torch.tensor([[0, 1, 1]]), 0).tolist() == [2]
