"""Request checks shared by the services: which tensors a batch needs, their dtypes and
how their shapes relate. Every failure is InvalidArgument naming the field."""
from __future__ import annotations

import torch

from tandem.data.batch import DataProto
from tandem.data.validate import check_rows, check_token_range, require_tensor
from tandem.rpc.errors import InvalidArgument

INT = (torch.int64, torch.int32)
FLOAT = (torch.float32,)


def check_prompts(batch: DataProto, vocab_size: int) -> None:
    """input_ids / attention_mask [B, Lp] (left-padded prompts)."""
    check_rows(batch)
    ids = require_tensor(batch, "input_ids", dtype=INT, ndim=2)
    require_tensor(batch, "attention_mask", dtype=INT + (torch.bool,), shape=tuple(ids.shape))
    check_token_range(batch, "input_ids", vocab_size)
    if bool((batch["attention_mask"].sum(-1) == 0).any()):
        raise InvalidArgument("tensor 'attention_mask': a row has no prompt token")


def check_sequences(batch: DataProto, vocab_size: int, float_keys: tuple[str, ...] = ()) -> None:
    """input_ids / attention_mask [B, T], responses / response_mask [B, R] (R <= T), and
    fp32 [B, R] tensors `float_keys` (e.g. old_log_probs, advantages)."""
    check_rows(batch)
    ids = require_tensor(batch, "input_ids", dtype=INT, ndim=2)
    b, t = ids.shape
    require_tensor(batch, "attention_mask", dtype=INT + (torch.bool,), shape=(b, t))
    resp = require_tensor(batch, "responses", dtype=INT, ndim=2)
    r = resp.shape[1]
    if resp.shape[0] != b or r > t or r < 1:
        raise InvalidArgument(f"tensor 'responses': shape {list(resp.shape)} does not fit "
                              f"input_ids {list(ids.shape)} (need [{b}, R] with 1 <= R <= {t})")
    if not torch.equal(ids[:, t - r:], resp):
        raise InvalidArgument("tensor 'responses': must equal the last R columns of 'input_ids'")
    require_tensor(batch, "response_mask", dtype=INT + FLOAT + (torch.bool,), shape=(b, r))
    check_token_range(batch, "input_ids", vocab_size)
    for key in float_keys:
        x = require_tensor(batch, key, dtype=FLOAT, shape=(b, r))
        if not bool(torch.isfinite(x).all()):
            raise InvalidArgument(f"tensor '{key}': contains NaN or inf")


def check_sft(batch: DataProto, vocab_size: int) -> None:
    check_rows(batch)
    ids = require_tensor(batch, "input_ids", dtype=INT, ndim=2)
    require_tensor(batch, "attention_mask", dtype=INT + (torch.bool,), shape=tuple(ids.shape))
    mask = require_tensor(batch, "loss_mask", dtype=INT + FLOAT + (torch.bool,), shape=tuple(ids.shape))
    check_token_range(batch, "input_ids", vocab_size)
    if not bool(mask[:, 1:].bool().any()):
        raise InvalidArgument("tensor 'loss_mask': no token to train on")
