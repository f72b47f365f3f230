"""The weight plane's messages (weights.proto) <-> its Python values; the fast chunk framing.

A stream chunk is a StreamWeightsResponse{chunk: WeightsChunk{offset, data}}: any protobuf
library reads it. Python's protobuf would copy a chunk's bytes three times on the way out
(tensor -> bytes -> message -> wire) and twice on the way in, so chunks are framed here by
hand: `chunk_message` writes the same wire bytes with one copy (the join of a small header
and the tensor's bytes), and `parse_stream_message` returns a zero-copy view of a received
chunk's data (the manifest and end messages go through protobuf). tests/wire checks both
against protobuf's own encoding.
"""
from __future__ import annotations

import torch

from tandem.data import codec
from tandem.rpc.errors import InvalidArgument
from tandem.v1 import weights_pb2
from tandem.weights import transport as T
from tandem.weights.layout import Manifest, TensorSpec
from tandem.weights.shared import ShareReply

_CHUNK_FIELD = 0x12  # StreamWeightsResponse.chunk: field 2, length-delimited
_OFFSET_TAG, _DATA_TAG = 0x08, 0x12  # WeightsChunk.offset (varint), .data (bytes)

TRANSPORTS = {T.STREAM: weights_pb2.WEIGHT_TRANSPORT_STREAM, T.IPC: weights_pb2.WEIGHT_TRANSPORT_IPC,
              T.COLLECTIVE: weights_pb2.WEIGHT_TRANSPORT_COLLECTIVE}
TRANSPORT_NAMES = {v: k for k, v in TRANSPORTS.items()}


def transport_from_pb(value: int) -> str | None:
    """WeightTransport -> a transport name (None: UNSPECIFIED, the receiver's choice)."""
    if value == weights_pb2.WEIGHT_TRANSPORT_UNSPECIFIED:
        return None
    if value not in TRANSPORT_NAMES:
        raise InvalidArgument(f"transport: unknown WeightTransport value {value}")
    return TRANSPORT_NAMES[value]


def manifest_to_pb(m: Manifest) -> weights_pb2.WeightsManifest:
    pb = weights_pb2.WeightsManifest(weights_version=m.version, total_bytes=m.total_bytes)
    for t in m.tensors:
        pb.tensors.add(name=t.name, dtype=codec.dtype_to_pb(t.dtype), shape=t.shape, offset=t.offset)
    return pb


def manifest_from_pb(pb: weights_pb2.WeightsManifest) -> Manifest:
    """Raises InvalidArgument for a tensor without a name, dtype or a valid shape (the layout
    itself is checked against the receiver's own by Manifest.mismatch)."""
    specs = []
    for i, t in enumerate(pb.tensors):
        if not t.name:
            raise InvalidArgument(f"manifest: tensor {i} has no name")
        if any(d < 0 for d in t.shape):
            raise InvalidArgument(f"manifest: tensor {t.name!r} has a negative dimension {list(t.shape)}")
        specs.append(TensorSpec(t.name, codec.dtype_from_pb(t.dtype, f"manifest: tensor {t.name!r}"),
                                tuple(t.shape), t.offset))
    return Manifest(pb.weights_version, tuple(specs), pb.total_bytes)


def placement_to_pb(p: T.Placement) -> weights_pb2.Placement:
    return weights_pb2.Placement(host_id=p.host_id, device_type=p.device_type, device_uuid=p.device_uuid,
                                 nccl=p.nccl)


def placement_from_pb(pb: weights_pb2.Placement) -> T.Placement:
    return T.Placement(pb.host_id, pb.device_type, pb.device_uuid, pb.nccl)


def ipc_to_pb(fields: dict) -> weights_pb2.CudaIpcTensor:
    return weights_pb2.CudaIpcTensor(**fields)


def ipc_from_pb(pb: weights_pb2.CudaIpcTensor) -> dict:
    from tandem.weights.ipc import FIELDS

    return {f: getattr(pb, f) for f in FIELDS}


def share_to_pb(r: ShareReply) -> weights_pb2.ShareWeightsResponse:
    pb = weights_pb2.ShareWeightsResponse(
        device_uuid=r.device_uuid, buffer_id=r.buffer_id, buffer_bytes=r.buffer_bytes, total_bytes=r.total_bytes,
        stamp=r.stamp, weights_version=r.weights_version, layout=r.layout, shm_path=r.shm_path, word_sum=r.word_sum)
    if r.manifest is not None:
        pb.manifest.CopyFrom(manifest_to_pb(r.manifest))
    if r.fields:
        pb.flat.CopyFrom(ipc_to_pb(r.fields))
    return pb


def share_from_pb(pb: weights_pb2.ShareWeightsResponse) -> ShareReply:
    """Raises InvalidArgument for sizes that cannot describe a layout and its stamp slot."""
    if not pb.buffer_id or pb.total_bytes < 0 or pb.buffer_bytes < pb.total_bytes + 8:
        raise InvalidArgument(f"ShareWeights: buffer {pb.buffer_id!r} of {pb.buffer_bytes} bytes cannot hold a "
                              f"{pb.total_bytes}-byte layout and its stamp")
    return ShareReply(pb.weights_version, pb.buffer_id, pb.buffer_bytes, pb.total_bytes, pb.stamp, pb.word_sum,
                      pb.layout, pb.device_uuid, manifest_from_pb(pb.manifest) if pb.HasField("manifest") else None,
                      ipc_from_pb(pb.flat) if pb.HasField("flat") else {}, pb.shm_path)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def chunk_message(offset: int, parts: list) -> bytes:
    """The serialized StreamWeightsResponse{chunk{offset, data}} whose data is the
    concatenation of `parts` (bytes-like objects: tensor byte views, zero padding)."""
    size = sum(memoryview(p).nbytes for p in parts)
    inner = bytes([_OFFSET_TAG]) + _varint(offset) + bytes([_DATA_TAG]) + _varint(size)
    return b"".join([bytes([_CHUNK_FIELD]), _varint(len(inner) + size), inner, *parts])


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def _fast_chunk(data: bytes) -> tuple[int, memoryview] | None:
    """(offset, data view) of a chunk framed as chunk_message frames it; None otherwise."""
    buf = memoryview(data)
    if len(buf) < 2 or buf[0] != _CHUNK_FIELD:
        return None
    size, pos = _read_varint(buf, 1)
    if pos + size != len(buf):
        return None
    offset = 0
    while pos < len(buf):
        tag = buf[pos]
        if tag == _OFFSET_TAG:
            offset, pos = _read_varint(buf, pos + 1)
        elif tag == _DATA_TAG:
            n, pos = _read_varint(buf, pos + 1)
            if pos + n != len(buf):
                return None
            return offset, buf[pos:pos + n]
        else:
            return None
    return offset, buf[len(buf):]


def parse_stream_message(data: bytes):
    """A received StreamWeightsResponse -> ("chunk", offset, data view) | ("manifest", Manifest)
    | ("end", version, total_bytes). Raises InvalidArgument for anything else."""
    try:
        fast = _fast_chunk(data)
    except ValueError:
        fast = None
    if fast is not None:
        return "chunk", fast[0], fast[1]
    try:
        msg = weights_pb2.StreamWeightsResponse.FromString(data)
    except Exception as e:  # noqa: BLE001 - any parse failure is a bad stream
        raise InvalidArgument(f"weights stream: a message is not a StreamWeightsResponse: {e}") from None
    kind = msg.WhichOneof("kind")
    if kind == "chunk":
        return "chunk", msg.chunk.offset, memoryview(msg.chunk.data)
    if kind == "manifest":
        return "manifest", manifest_from_pb(msg.manifest)
    if kind == "end":
        return "end", msg.end.weights_version, msg.end.total_bytes
    raise InvalidArgument("weights stream: an empty message")


def manifest_message(m: Manifest) -> weights_pb2.StreamWeightsResponse:
    return weights_pb2.StreamWeightsResponse(manifest=manifest_to_pb(m))


def end_message(version: int, total_bytes: int) -> weights_pb2.StreamWeightsResponse:
    return weights_pb2.StreamWeightsResponse(end=weights_pb2.WeightsEnd(weights_version=version,
                                                                        total_bytes=total_bytes))


def zeros(n: int) -> bytes:
    return bytes(n)


def tensor_bytes(t: torch.Tensor):
    """A CPU uint8 tensor's memory as a buffer join() can read (no copy)."""
    return memoryview(t.numpy())
