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
    check_mask(batch, "attention_mask")
    if bool((batch["attention_mask"].sum(-1) == 0).any()):
        raise InvalidArgument("tensor 'attention_mask': a row has no prompt token")


def check_mask(batch: DataProto, name: str) -> torch.Tensor:
    """Tensor `name` holds only 0 and 1 (any dtype) -> it as bool."""
    m = batch[name]
    if m.dtype != torch.bool and not bool(((m == 0) | (m == 1)).all()):
        raise InvalidArgument(f"tensor '{name}': values must be 0 or 1")
    return m.bool()


def check_contiguous(batch: DataProto, name: str) -> None:
    """Each row of mask `name` has one run of ones: [left padding | tokens | right padding]."""
    m = check_mask(batch, name).long()
    runs = (m[:, 1:] > m[:, :-1]).sum(-1) + m[:, 0]
    if bool((runs != 1).any()):
        row = int((runs != 1).nonzero()[0])
        raise InvalidArgument(f"tensor '{name}': row {row} has no token or is not one run of tokens "
                              "([left-padded prompt | right-padded response])")


def check_meta(batch: DataProto) -> None:
    """meta 'temperature' (a finite number > 0) and 'rollout_n' (an integer >= 1), when present."""
    t = batch.meta.get("temperature", 1.0)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
        raise InvalidArgument(f"meta 'temperature': must be a finite number > 0, got {t!r}")
    n = batch.meta.get("rollout_n", 1)
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not (n >= 1 and float(n).is_integer()):
        raise InvalidArgument(f"meta 'rollout_n': must be an integer >= 1, got {n!r}")


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
    check_contiguous(batch, "attention_mask")
    if bool((check_mask(batch, "response_mask") & ~batch["attention_mask"][:, t - r:].bool()).any()):
        raise InvalidArgument("tensor 'response_mask': 1 where 'attention_mask' has no token")
    check_floats(batch, float_keys)


def check_floats(batch: DataProto, keys: tuple[str, ...]) -> None:
    """fp32 [B, R] finite tensors `keys`, R from 'responses' (already checked)."""
    shape = tuple(batch["responses"].shape)
    for key in keys:
        x = require_tensor(batch, key, dtype=FLOAT, shape=shape)
        if not bool(torch.isfinite(x).all()):
            raise InvalidArgument(f"tensor '{key}': contains NaN or inf")


def check_sft(batch: DataProto, vocab_size: int) -> None:
    check_rows(batch)
    ids = require_tensor(batch, "input_ids", dtype=INT, ndim=2)
    require_tensor(batch, "attention_mask", dtype=INT + (torch.bool,), shape=tuple(ids.shape))
    require_tensor(batch, "loss_mask", dtype=INT + FLOAT + (torch.bool,), shape=tuple(ids.shape))
    check_token_range(batch, "input_ids", vocab_size)
    check_contiguous(batch, "attention_mask")
    mask = check_mask(batch, "loss_mask")
    if bool((mask & ~batch["attention_mask"].bool()).any()):
        raise InvalidArgument("tensor 'loss_mask': 1 where 'attention_mask' has no token")
    if not bool(mask[:, 1:].any()):
        raise InvalidArgument("tensor 'loss_mask': no token to train on")
