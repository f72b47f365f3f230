"""Servicer-side request checks on a decoded DataProto.

Each helper raises `InvalidArgument` with a message naming the field, so a
servicer can validate in a few lines before calling its worker (STYLE 9.2
habit 4). The codec already guarantees consistent rows and well-formed
tensors; these checks are about what a particular RPC needs.
"""

from __future__ import annotations

from typing import Sequence

import torch

from tandem.data.batch import DataProto
from tandem.rpc.errors import InvalidArgument


def _dtype_name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def require_tensor(batch: DataProto, name: str,
                   dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
                   ndim: int | None = None,
                   shape: Sequence[int | None] | None = None) -> torch.Tensor:
    """The tensor `name`, checked for dtype (one or any of a tuple), ndim and
    shape (a sequence whose None entries match any size)."""
    t = batch.tensors.get(name)
    if t is None:
        where = "it is a column" if name in batch.columns else f"tensors present: {sorted(batch.tensors)}"
        raise InvalidArgument(f"missing tensor '{name}' ({where})")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            want = " or ".join(_dtype_name(d) for d in allowed)
            raise InvalidArgument(f"tensor '{name}': dtype {_dtype_name(t.dtype)}, expected {want}")
    if ndim is not None and t.dim() != ndim:
        raise InvalidArgument(f"tensor '{name}': {t.dim()} dims (shape {list(t.shape)}), expected {ndim}")
    if shape is not None:
        ok = len(shape) == t.dim() and all(w is None or w == s for w, s in zip(shape, t.shape))
        if not ok:
            want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
            raise InvalidArgument(f"tensor '{name}': shape {list(t.shape)}, expected {want}")
    return t


def require_column(batch: DataProto, name: str) -> list:
    """The column `name` (InvalidArgument if absent)."""
    c = batch.columns.get(name)
    if c is None:
        where = "it is a tensor" if name in batch.tensors else f"columns present: {sorted(batch.columns)}"
        raise InvalidArgument(f"missing column '{name}' ({where})")
    return c


def check_same_shape(batch: DataProto, a: str, b: str) -> None:
    """Tensors `a` and `b` exist and have equal shapes."""
    ta, tb = require_tensor(batch, a), require_tensor(batch, b)
    if ta.shape != tb.shape:
        raise InvalidArgument(f"tensor '{b}': shape {list(tb.shape)} differs from tensor '{a}' {list(ta.shape)}")


def check_token_range(batch: DataProto, name: str, vocab_size: int) -> None:
    """Every id of integer tensor `name` lies in [0, vocab_size)."""
    t = require_tensor(batch, name, dtype=(torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8))
    if t.numel() == 0:
        return
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise InvalidArgument(f"tensor '{name}': token id {bad} out of vocabulary [0, {vocab_size})")


def check_rows(batch: DataProto, min_rows: int = 1) -> int:
    """len(batch) >= min_rows; returns the row count."""
    n = len(batch)
    if n < min_rows:
        raise InvalidArgument(f"batch: {n} rows, need at least {min_rows}")
    return n
