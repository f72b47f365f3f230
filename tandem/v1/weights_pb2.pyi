from tandem.v1 import data_pb2 as _data_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WeightTransport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_TRANSPORT_UNSPECIFIED: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_STREAM: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_IPC: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_COLLECTIVE: _ClassVar[WeightTransport]
WEIGHT_TRANSPORT_UNSPECIFIED: WeightTransport
WEIGHT_TRANSPORT_STREAM: WeightTransport
WEIGHT_TRANSPORT_IPC: WeightTransport
WEIGHT_TRANSPORT_COLLECTIVE: WeightTransport

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: _data_pb2.DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[_data_pb2.DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ...) -> None: ...

class WeightsManifest(_message.Message):
    __slots__ = ("weights_version", "tensors", "total_bytes")
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    weights_version: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    total_bytes: int
    def __init__(self, weights_version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("host_id", "device_type", "device_uuid", "nccl")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    NCCL_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    device_type: str
    device_uuid: str
    nccl: bool
    def __init__(self, host_id: _Optional[str] = ..., device_type: _Optional[str] = ..., device_uuid: _Optional[str] = ..., nccl: _Optional[bool] = ...) -> None: ...

class GetWeightsManifestRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetWeightsManifestResponse(_message.Message):
    __slots__ = ("manifest", "placement")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightsManifest
    placement: Placement
    def __init__(self, manifest: _Optional[_Union[WeightsManifest, _Mapping]] = ..., placement: _Optional[_Union[Placement, _Mapping]] = ...) -> None: ...

class StreamWeightsRequest(_message.Message):
    __slots__ = ("weights_version", "chunk_bytes", "start", "end")
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    weights_version: int
    chunk_bytes: int
    start: int
    end: int
    def __init__(self, weights_version: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class WeightsChunk(_message.Message):
    __slots__ = ("offset", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class WeightsEnd(_message.Message):
    __slots__ = ("weights_version", "total_bytes")
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    weights_version: int
    total_bytes: int
    def __init__(self, weights_version: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class StreamWeightsResponse(_message.Message):
    __slots__ = ("manifest", "chunk", "end")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightsManifest
    chunk: WeightsChunk
    end: WeightsEnd
    def __init__(self, manifest: _Optional[_Union[WeightsManifest, _Mapping]] = ..., chunk: _Optional[_Union[WeightsChunk, _Mapping]] = ..., end: _Optional[_Union[WeightsEnd, _Mapping]] = ...) -> None: ...

class CudaIpcTensor(_message.Message):
    __slots__ = ("storage_handle", "storage_size_bytes", "storage_offset_bytes", "tensor_offset", "ref_counter_handle", "ref_counter_offset", "event_handle", "event_sync_required")
    STORAGE_HANDLE_FIELD_NUMBER: _ClassVar[int]
    STORAGE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENSOR_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_HANDLE_FIELD_NUMBER: _ClassVar[int]
    REF_COUNTER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EVENT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    EVENT_SYNC_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    storage_handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    tensor_offset: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    def __init__(self, storage_handle: _Optional[bytes] = ..., storage_size_bytes: _Optional[int] = ..., storage_offset_bytes: _Optional[int] = ..., tensor_offset: _Optional[int] = ..., ref_counter_handle: _Optional[bytes] = ..., ref_counter_offset: _Optional[int] = ..., event_handle: _Optional[bytes] = ..., event_sync_required: _Optional[bool] = ...) -> None: ...

class ShareWeightsRequest(_message.Message):
    __slots__ = ("weights_version", "known_buffer", "known_layout")
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    KNOWN_BUFFER_FIELD_NUMBER: _ClassVar[int]
    KNOWN_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    weights_version: int
    known_buffer: str
    known_layout: str
    def __init__(self, weights_version: _Optional[int] = ..., known_buffer: _Optional[str] = ..., known_layout: _Optional[str] = ...) -> None: ...

class ShareWeightsResponse(_message.Message):
    __slots__ = ("manifest", "device_uuid", "flat", "buffer_id", "buffer_bytes", "total_bytes", "stamp", "weights_version", "layout", "shm_path", "word_sum")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    FLAT_FIELD_NUMBER: _ClassVar[int]
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    BUFFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    STAMP_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SHM_PATH_FIELD_NUMBER: _ClassVar[int]
    WORD_SUM_FIELD_NUMBER: _ClassVar[int]
    manifest: WeightsManifest
    device_uuid: str
    flat: CudaIpcTensor
    buffer_id: str
    buffer_bytes: int
    total_bytes: int
    stamp: int
    weights_version: int
    layout: str
    shm_path: str
    word_sum: int
    def __init__(self, manifest: _Optional[_Union[WeightsManifest, _Mapping]] = ..., device_uuid: _Optional[str] = ..., flat: _Optional[_Union[CudaIpcTensor, _Mapping]] = ..., buffer_id: _Optional[str] = ..., buffer_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., stamp: _Optional[int] = ..., weights_version: _Optional[int] = ..., layout: _Optional[str] = ..., shm_path: _Optional[str] = ..., word_sum: _Optional[int] = ...) -> None: ...

class ReleaseWeightsRequest(_message.Message):
    __slots__ = ("weights_version",)
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    weights_version: int
    def __init__(self, weights_version: _Optional[int] = ...) -> None: ...

class ReleaseWeightsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JoinWeightGroupRequest(_message.Message):
    __slots__ = ("group_id", "receiver", "store_host", "store_port", "world_size", "backend", "timeout_s")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    receiver: str
    store_host: str
    store_port: int
    world_size: int
    backend: str
    timeout_s: float
    def __init__(self, group_id: _Optional[str] = ..., receiver: _Optional[str] = ..., store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., world_size: _Optional[int] = ..., backend: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class JoinWeightGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BroadcastWeightsRequest(_message.Message):
    __slots__ = ("group_id", "weights_version", "bucket_bytes")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    weights_version: int
    bucket_bytes: int
    def __init__(self, group_id: _Optional[str] = ..., weights_version: _Optional[int] = ..., bucket_bytes: _Optional[int] = ...) -> None: ...

class BroadcastWeightsResponse(_message.Message):
    __slots__ = ("ready", "done_bytes")
    READY_FIELD_NUMBER: _ClassVar[int]
    DONE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ready: WeightsManifest
    done_bytes: int
    def __init__(self, ready: _Optional[_Union[WeightsManifest, _Mapping]] = ..., done_bytes: _Optional[int] = ...) -> None: ...
