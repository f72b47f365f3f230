"""DataProto <-> tandem.v1 messages; the only module that knows both.

Tensors travel as raw little-endian bytes in C order (data.proto). Copies:

- encode: one copy per tensor, `ndarray.tobytes()` (which also makes a
  non-contiguous tensor C-ordered in the same pass). bf16 is sent as its
  int16 bit pattern. A CUDA tensor costs a device->host transfer first.
  (protobuf then copies the bytes into the message, and again when it
  serializes; that is in C and outside our control.)
- decode: reading `Tensor.data` from a parsed message already yields a fresh
  bytes object (upb copies on access); we copy it once more into a tensor we
  own (`torch.empty` + memcpy). Decoded tensors are therefore writable,
  aligned and independent of the message. A zero-copy `torch.frombuffer`
  view would save that copy but writes would mutate an immutable `bytes`
  (interned for 0/1-byte values); bench/codec_bench.py measures the cost.

Decoding validates everything and raises `InvalidArgument` naming the field.
Meta travels as a google.protobuf.Struct: numbers become floats (1 -> 1.0,
ints above 2**53 lose precision), tuples become lists; nothing is converted
back. Columns whose values are all `str` travel as plain strings; any other
column is sent as JSON texts (json=True), so dict keys become strings.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from google.protobuf import json_format

from tandem.data.batch import DataProto
from tandem.rpc.errors import InvalidArgument
from tandem.v1 import data_pb2

if sys.byteorder != "little":  # pragma: no cover - no such host in CI
    raise RuntimeError(
        "tandem.data.codec: this host is big-endian; the tandem.v1 wire format is "
        "little-endian raw bytes and this codec does not byte-swap")

_D = data_pb2.DType
_TO_PB: dict[torch.dtype, int] = {
    torch.float32: _D.DTYPE_FLOAT32, torch.float16: _D.DTYPE_FLOAT16,
    torch.bfloat16: _D.DTYPE_BFLOAT16, torch.float64: _D.DTYPE_FLOAT64,
    torch.int64: _D.DTYPE_INT64, torch.int32: _D.DTYPE_INT32, torch.int16: _D.DTYPE_INT16,
    torch.int8: _D.DTYPE_INT8, torch.uint8: _D.DTYPE_UINT8, torch.bool: _D.DTYPE_BOOL,
}
_FROM_PB: dict[int, torch.dtype] = {v: k for k, v in _TO_PB.items()}
_NAME = {v: str(k).removeprefix("torch.") for k, v in _TO_PB.items()}
_ITEMSIZE = {v: torch.empty((), dtype=k).element_size() for k, v in _TO_PB.items()}


# ---- tensors ---------------------------------------------------------------

def dtype_to_pb(dtype: torch.dtype) -> int:
    """torch dtype -> tandem.v1 DType (TypeError for one the wire has no name for)."""
    if dtype not in _TO_PB:
        raise TypeError(f"dtype {dtype} has no tandem.v1 DType")
    return _TO_PB[dtype]


def dtype_from_pb(value: int, label: str) -> torch.dtype:
    """tandem.v1 DType -> torch dtype (InvalidArgument naming `label` for an unknown value)."""
    if value not in _FROM_PB:
        raise InvalidArgument(f"{label}: {'DTYPE_UNSPECIFIED' if value == 0 else f'unknown dtype {value}'}")
    return _FROM_PB[value]


def encode_tensor(name: str, t: torch.Tensor) -> data_pb2.Tensor:
    """One tensor -> data_pb2.Tensor (one copy: tensor -> bytes)."""
    return _fill_tensor(data_pb2.Tensor(), name, t)


def _fill_tensor(pb: data_pb2.Tensor, name: str, t: torch.Tensor) -> data_pb2.Tensor:
    # Fill a message in place: `Batch(tensors=[Tensor(...)])` would copy the bytes again.
    pb_dtype = _TO_PB.get(t.dtype)
    if pb_dtype is None:
        raise TypeError(f"tensor '{name}': dtype {t.dtype} has no tandem.v1 DType")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)  # numpy has no bf16; same bits
    pb.name, pb.dtype = name, pb_dtype
    pb.shape.extend(t.shape)
    pb.data = t.resolve_conj().resolve_neg().numpy().tobytes(order="C")
    return pb


def decode_tensor(pb: data_pb2.Tensor, where: str = "tensor") -> tuple[str, torch.Tensor]:
    """data_pb2.Tensor -> (name, writable tensor we own). Raises InvalidArgument."""
    name = pb.name
    if not name:
        raise InvalidArgument(f"{where}: a tensor has an empty name")
    label = f"tensor '{name}'"
    dtype = _FROM_PB.get(pb.dtype)
    if dtype is None:
        what = "DTYPE_UNSPECIFIED" if pb.dtype == 0 else f"unknown dtype enum value {pb.dtype}"
        raise InvalidArgument(f"{label}: {what}")
    shape = list(pb.shape)
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"{label}: negative dimension in shape {shape}")
    data = pb.data  # a fresh bytes object (upb copies on access)
    itemsize = _ITEMSIZE[pb.dtype]
    numel = 1
    for d in shape:
        numel *= d
    if len(data) != numel * itemsize:
        raise InvalidArgument(f"{label}: {len(data)} bytes do not match shape {shape} x "
                              f"{_NAME[pb.dtype]} ({numel * itemsize} bytes)")
    raw = torch.empty(len(data), dtype=torch.uint8)
    if data:
        raw.numpy()[:] = np.frombuffer(data, dtype=np.uint8)  # the one copy
    if dtype == torch.bool and numel and int(raw.max()) > 1:
        raise InvalidArgument(f"{label}: bool bytes must be 0 or 1")
    return name, raw.view(dtype).reshape(shape)


def encode_named(tensors: dict[str, torch.Tensor]) -> data_pb2.NamedTensors:
    """Tensors of any shapes (e.g. weights) -> NamedTensors."""
    pb = data_pb2.NamedTensors()
    for k, t in tensors.items():
        _fill_tensor(pb.tensors.add(), k, t)
    return pb


def decode_named(pb: data_pb2.NamedTensors) -> dict[str, torch.Tensor]:
    """NamedTensors -> {name: tensor}; names must be unique."""
    out: dict[str, torch.Tensor] = {}
    for tpb in pb.tensors:
        name, t = decode_tensor(tpb, where="named tensors")
        if name in out:
            raise InvalidArgument(f"named tensors: duplicate name '{name}'")
        out[name] = t
    return out


# ---- batches ---------------------------------------------------------------

def encode_batch(batch: DataProto) -> data_pb2.Batch:
    """DataProto -> data_pb2.Batch. Raises ValueError/TypeError on a malformed batch."""
    batch.check()
    pb = data_pb2.Batch()
    for k, t in batch.tensors.items():
        _fill_tensor(pb.tensors.add(), k, t)
    for name, values in batch.columns.items():
        if all(isinstance(v, str) for v in values):
            pb.columns.add(name=name, values=values, json=False)
            continue
        try:
            texts = [json.dumps(v, ensure_ascii=False, allow_nan=False) for v in values]
        except (TypeError, ValueError) as e:
            raise TypeError(f"column '{name}': values are neither all str nor JSON-serialisable: {e}") from e
        pb.columns.add(name=name, values=texts, json=True)
    if batch.meta:
        try:
            pb.meta.update(batch.meta)
        except (TypeError, ValueError, AttributeError) as e:
            raise TypeError(f"meta: not representable as a protobuf Struct: {e}") from e
    return pb


def decode_batch(pb: data_pb2.Batch) -> DataProto:
    """data_pb2.Batch -> DataProto. Raises InvalidArgument naming the bad field."""
    tensors: dict[str, torch.Tensor] = {}
    columns: dict[str, list] = {}
    first: tuple[str, int] | None = None  # (label, rows) of the first tensor/column

    def rows_agree(label: str, rows: int) -> None:
        nonlocal first
        if first is None:
            first = (label, rows)
        elif rows != first[1]:
            raise InvalidArgument(f"batch: {first[0]} has {first[1]} rows but {label} has {rows}")

    for tpb in pb.tensors:
        if tpb.name in tensors:
            raise InvalidArgument(f"batch: duplicate tensor name '{tpb.name}'")
        if len(tpb.shape) == 0:
            raise InvalidArgument(f"batch: tensor '{tpb.name}' is 0-dim; batch tensors need a row dimension")
        name, t = decode_tensor(tpb, where="batch")
        rows_agree(f"tensor '{name}'", t.shape[0])
        tensors[name] = t
    for cpb in pb.columns:
        name = cpb.name
        if not name:
            raise InvalidArgument("batch: a column has an empty name")
        if name in tensors or name in columns:
            raise InvalidArgument(f"batch: duplicate name '{name}'")
        values = list(cpb.values)
        if cpb.json:
            for i, v in enumerate(values):
                try:
                    values[i] = json.loads(v)
                except ValueError as e:
                    raise InvalidArgument(f"column '{name}': row {i} is not valid JSON: {e}") from None
        rows_agree(f"column '{name}'", len(values))
        columns[name] = values
    try:
        meta = json_format.MessageToDict(pb.meta) if pb.HasField("meta") else {}
    except ValueError as e:  # e.g. a NaN number, which JSON cannot hold
        raise InvalidArgument(f"meta: {e}") from None
    return DataProto(tensors=tensors, columns=columns, meta=meta)
