"""The manifest of a weights version and its flat byte layout.

Every transport moves the same thing: the TP=1 tensors of a version laid out back to back in
one flat byte range, each at an offset aligned to ALIGN bytes (so a view of a received byte
buffer at that offset is a valid tensor of any dtype). Sender and receiver compute the layout
with the same function from (name, dtype, shape) in the model table's order, so a receiver
checks a sender's manifest field by field instead of trusting its offsets. Pieces of the flat
range (stream chunks, broadcast buckets) map back to tensor byte ranges with `pieces`.

Pure CPU bookkeeping: no transport, no model.
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

ALIGN = 256


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # byte offset in the flat layout

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class Manifest:
    version: int
    tensors: tuple[TensorSpec, ...]
    total_bytes: int

    @classmethod
    def build(cls, version: int, entries: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> Manifest:
        """The layout of `entries` (name, dtype, shape) in this order."""
        specs, offset = [], 0
        for name, dtype, shape in entries:
            spec = TensorSpec(name, dtype, tuple(int(d) for d in shape), offset)
            specs.append(spec)
            offset = _align(offset + spec.nbytes)
        return cls(version, tuple(specs), offset)

    @classmethod
    def of(cls, version: int, tensors: dict[str, torch.Tensor]) -> Manifest:
        return cls.build(version, [(k, t.dtype, tuple(t.shape)) for k, t in tensors.items()])

    @functools.cached_property
    def offsets(self) -> list[int]:
        return [t.offset for t in self.tensors]

    @functools.cached_property
    def fingerprint(self) -> str:
        """A digest of the layout (names, dtypes, shapes, offsets, size; not the version): equal
        fingerprints, equal layouts (a reader checks a layout once, then compares this)."""
        text = repr([(t.name, str(t.dtype), t.shape, t.offset) for t in self.tensors] + [self.total_bytes])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def with_version(self, version: int) -> Manifest:
        return Manifest(version, self.tensors, self.total_bytes)

    def mismatch(self, expected: Manifest) -> str | None:
        """The first difference from the layout the receiver expects (names, dtypes, shapes,
        offsets, size), as a message naming the tensor; None when they agree."""
        mine = {t.name: t for t in self.tensors}
        want = {t.name: t for t in expected.tensors}
        if len(mine) != len(self.tensors):
            return "manifest: a tensor name appears twice"
        missing = [n for n in want if n not in mine]
        unexpected = [n for n in mine if n not in want]
        if missing or unexpected:
            return f"manifest: missing tensors {missing[:5]}, unexpected tensors {unexpected[:5]}"
        for got, exp in zip(self.tensors, expected.tensors):
            if got.name != exp.name:
                return f"manifest: tensor {got.name!r} where {exp.name!r} was expected (table order)"
            if got.dtype != exp.dtype:
                return f"manifest: tensor {got.name!r} has dtype {got.dtype}, expected {exp.dtype}"
            if got.shape != exp.shape:
                return f"manifest: tensor {got.name!r} has shape {list(got.shape)}, expected {list(exp.shape)}"
            if got.offset != exp.offset:
                return f"manifest: tensor {got.name!r} at offset {got.offset}, expected {exp.offset}"
        if self.total_bytes != expected.total_bytes:
            return f"manifest: total_bytes {self.total_bytes}, expected {expected.total_bytes}"
        return None


def ranges(total_bytes: int, size: int) -> list[tuple[int, int]]:
    """[0, size), [size, 2 size), ... covering [0, total_bytes) (chunks, buckets)."""
    if size <= 0:
        raise ValueError(f"piece size must be > 0, got {size}")
    return [(a, min(a + size, total_bytes)) for a in range(0, total_bytes, size)]


def pieces(manifest: Manifest, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """The tensors' bytes inside the flat range [start, end): (tensor index, first byte, last
    byte + 1) in tensor-byte coordinates, in order. Bytes between tensors (padding) belong to
    none."""
    first = max(0, bisect.bisect_right(manifest.offsets, start) - 1)  # the last tensor starting at or before
    for i in range(first, len(manifest.tensors)):
        spec = manifest.tensors[i]
        if spec.offset >= end:
            return
        lo, hi = max(start, spec.offset), min(end, spec.offset + spec.nbytes)
        if lo < hi:
            yield i, lo - spec.offset, hi - spec.offset


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view (no copy)."""
    if not t.is_contiguous():
        raise ValueError("byte_view needs a contiguous tensor")
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)


def views(buffer: torch.Tensor, manifest: Manifest) -> list[torch.Tensor]:
    """Each tensor of the manifest as a view of a flat uint8 buffer of its layout."""
    out = []
    for spec in manifest.tensors:
        raw = buffer[spec.offset: spec.offset + spec.nbytes]
        out.append(raw.view(spec.dtype).view(spec.shape))
    return out
