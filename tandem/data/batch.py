"""DataProto: the in-memory batch that flows between Tandem roles.

A DataProto holds named tensors and named per-row columns (lists of Python
values: strings, dicts, ...) that all share dimension 0 (rows), plus `meta`,
a dict of batch-level settings. Its operations (select, slice, index, concat,
split, chunk, repeat, pad, union) mirror verl's DataProto, minus pickling:
the wire form lives in `tandem.data.codec`.

Operations return new DataProto objects; tensors are shared (views) where
torch allows it, never copied needlessly. Nothing here knows about gRPC.
Imports only torch, numpy and the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch


@dataclass
class DataProto:
    """Named tensors + per-row columns sharing dim 0, and batch-level `meta`."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    columns: dict[str, list] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    # ---- shape -------------------------------------------------------------

    def __len__(self) -> int:
        """Number of rows (0 when the batch has no tensors and no columns)."""
        for t in self.tensors.values():
            return int(t.shape[0]) if t.dim() > 0 else 0
        for c in self.columns.values():
            return len(c)
        return 0

    def check(self) -> "DataProto":
        """Raise ValueError naming the offending key unless all rows agree."""
        first: tuple[str, int] | None = None
        for kind, name, rows in self._row_counts():
            if rows is None:
                raise ValueError(f"batch: tensor '{name}' is 0-dim; batch tensors need a row dimension")
            if first is None:
                first = (f"{kind} '{name}'", rows)
            elif rows != first[1]:
                raise ValueError(f"batch: {first[0]} has {first[1]} rows but {kind} '{name}' has {rows}")
        both = set(self.tensors) & set(self.columns)
        if both:
            raise ValueError(f"batch: name(s) {sorted(both)} used by both a tensor and a column")
        return self

    def _row_counts(self):
        for k, t in self.tensors.items():
            yield "tensor", k, (int(t.shape[0]) if t.dim() > 0 else None)
        for k, c in self.columns.items():
            yield "column", k, len(c)

    def __getitem__(self, key: str) -> torch.Tensor | list:
        """The tensor or column called `key` (KeyError if neither)."""
        if key in self.tensors:
            return self.tensors[key]
        if key in self.columns:
            return self.columns[key]
        raise KeyError(f"batch has no tensor or column '{key}' "
                       f"(tensors: {sorted(self.tensors)}, columns: {sorted(self.columns)})")

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.columns

    def _new(self, tensors: dict, columns: dict) -> "DataProto":
        return DataProto(tensors=tensors, columns=columns, meta=dict(self.meta))

    # ---- row selection -----------------------------------------------------

    def select(self, tensor_keys: Sequence[str] | None = None,
               column_keys: Sequence[str] | None = None) -> "DataProto":
        """Keep only the named tensors / columns (None keeps all of that kind)."""
        tk = list(self.tensors) if tensor_keys is None else list(tensor_keys)
        ck = list(self.columns) if column_keys is None else list(column_keys)
        for k in tk:
            if k not in self.tensors:
                raise KeyError(f"select: no tensor '{k}'")
        for k in ck:
            if k not in self.columns:
                raise KeyError(f"select: no column '{k}'")
        return self._new({k: self.tensors[k] for k in tk}, {k: self.columns[k] for k in ck})

    def slice(self, start: int, stop: int) -> "DataProto":
        """Rows [start, stop) (tensors are views)."""
        return self._new({k: t[start:stop] for k, t in self.tensors.items()},
                         {k: c[start:stop] for k, c in self.columns.items()})

    def index(self, idx: torch.Tensor | Sequence[int]) -> "DataProto":
        """Rows at positions `idx` (a 1-D integer tensor or list), in that order."""
        idx_t = torch.as_tensor(idx, dtype=torch.long).reshape(-1)
        idx_l = idx_t.tolist()
        n = len(self)
        if idx_l and not (0 <= min(idx_l) and max(idx_l) < n):
            raise IndexError(f"index: row indices must lie in [0, {n}), got {min(idx_l)}..{max(idx_l)}")
        return self._new({k: t.index_select(0, idx_t.to(t.device)) for k, t in self.tensors.items()},
                         {k: [c[i] for i in idx_l] for k, c in self.columns.items()})

    # ---- combining and splitting ------------------------------------------

    @staticmethod
    def concat(parts: Sequence["DataProto"]) -> "DataProto":
        """Concatenate along rows; all parts need the same keys. Meta from parts[0]."""
        if not parts:
            raise ValueError("concat: no parts")
        first = parts[0]
        for i, p in enumerate(parts[1:], 1):
            if set(p.tensors) != set(first.tensors) or set(p.columns) != set(first.columns):
                raise ValueError(f"concat: part {i} has keys {sorted(p.tensors) + sorted(p.columns)}, "
                                 f"part 0 has {sorted(first.tensors) + sorted(first.columns)}")
        tensors = {k: torch.cat([p.tensors[k] for p in parts], dim=0) for k in first.tensors}
        columns = {k: [v for p in parts for v in p.columns[k]] for k in first.columns}
        return first._new(tensors, columns)

    def split(self, size: int) -> list["DataProto"]:
        """Chunks of `size` rows, the last one shorter; [] for an empty batch."""
        if size <= 0:
            raise ValueError(f"split: size must be > 0, got {size}")
        return [self.slice(s, s + size) for s in range(0, len(self), size)]

    def chunk(self, k: int) -> list["DataProto"]:
        """`k` parts of nearly equal size (the first len % k parts one row longer).

        Requires len(self) >= k so that no part is empty (an empty part would
        reach a DP rank with nothing to run); pad first with pad_to_multiple.
        """
        n = len(self)
        if k <= 0:
            raise ValueError(f"chunk: k must be > 0, got {k}")
        if n < k:
            raise ValueError(f"chunk: {n} rows cannot make {k} non-empty parts")
        base, extra = divmod(n, k)
        out, start = [], 0
        for i in range(k):
            stop = start + base + (1 if i < extra else 0)
            out.append(self.slice(start, stop))
            start = stop
        return out

    def repeat(self, n: int, interleave: bool = True) -> "DataProto":
        """Repeat every row n times: interleave -> r0 r0 r1 r1; else r0 r1 r0 r1."""
        if n < 1:
            raise ValueError(f"repeat: n must be >= 1, got {n}")
        if interleave:
            tensors = {k: t.repeat_interleave(n, dim=0) for k, t in self.tensors.items()}
            columns = {k: [v for v in c for _ in range(n)] for k, c in self.columns.items()}
        else:
            tensors = {k: t.repeat(n, *([1] * (t.dim() - 1))) for k, t in self.tensors.items()}
            columns = {k: list(c) * n for k, c in self.columns.items()}
        return self._new(tensors, columns)

    def pad_to_multiple(self, k: int) -> tuple["DataProto", int]:
        """Append copies of the first rows (cycling) so len is a multiple of k.

        Returns (padded, pad_count); `padded.unpad(pad_count)` restores self.
        An empty batch is returned unpadded (there is no row to copy).
        """
        if k <= 0:
            raise ValueError(f"pad_to_multiple: k must be > 0, got {k}")
        n = len(self)
        pad = (-n) % k
        if pad == 0 or n == 0:
            return self._new(dict(self.tensors), dict(self.columns)), 0
        return DataProto.concat([self, self.index([i % n for i in range(pad)])]), pad

    def unpad(self, pad_count: int) -> "DataProto":
        """Drop the last `pad_count` rows (undoes pad_to_multiple)."""
        if not 0 <= pad_count <= len(self):
            raise ValueError(f"unpad: pad_count {pad_count} not in [0, {len(self)}]")
        return self.slice(0, len(self) - pad_count)

    def union(self, other: "DataProto") -> "DataProto":
        """A new batch with the keys of both; shared keys must hold equal data.

        Raises ValueError on different row counts or on a shared key (tensor,
        column or meta entry) whose values differ.
        """
        if self._has_keys() and other._has_keys() and len(self) != len(other):
            raise ValueError(f"union: {len(self)} rows vs {len(other)} rows")
        tensors, columns, meta = dict(self.tensors), dict(self.columns), dict(self.meta)
        for k, t in other.tensors.items():
            if k in tensors and not (tensors[k].dtype == t.dtype and tensors[k].shape == t.shape
                                     and torch.equal(tensors[k], t.to(tensors[k].device))):
                raise ValueError(f"union: tensor '{k}' differs between the two batches")
            tensors[k] = tensors.get(k, t)
        for k, c in other.columns.items():
            if k in columns and columns[k] != c:
                raise ValueError(f"union: column '{k}' differs between the two batches")
            columns[k] = columns.get(k, c)
        for k, v in other.meta.items():
            if k in meta and meta[k] != v:
                raise ValueError(f"union: meta '{k}' differs ({meta[k]!r} vs {v!r})")
            meta[k] = meta.get(k, v)
        return DataProto(tensors=tensors, columns=columns, meta=meta)

    def _has_keys(self) -> bool:
        return bool(self.tensors or self.columns)

    def to(self, device: torch.device | str) -> "DataProto":
        """Tensors moved to `device` (columns and meta unchanged)."""
        return self._new({k: t.to(device) for k, t in self.tensors.items()}, dict(self.columns))

    def __repr__(self) -> str:
        ts = ", ".join(f"{k}: {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
                       for k, t in self.tensors.items())
        return (f"DataProto(rows={len(self)}, tensors={{{ts}}}, "
                f"columns={sorted(self.columns)}, meta={self.meta!r})")
