from tandem.v1 import data_pb2 as _data_pb2
from tandem.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_new_tokens", "n", "seed", "stop_token_ids", "greedy", "row_offset")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    GREEDY_FIELD_NUMBER: _ClassVar[int]
    ROW_OFFSET_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    n: int
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    greedy: bool
    row_offset: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., n: _Optional[int] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., greedy: _Optional[bool] = ..., row_offset: _Optional[int] = ...) -> None: ...

class GenerateSequencesRequest(_message.Message):
    __slots__ = ("batch", "sampling", "keep")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    sampling: SamplingParams
    keep: KeepRows
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., keep: _Optional[_Union[KeepRows, _Mapping]] = ...) -> None: ...

class KeepRows(_message.Message):
    __slots__ = ("calculate_entropy", "with_reference", "before_update")
    CALCULATE_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    WITH_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    BEFORE_UPDATE_FIELD_NUMBER: _ClassVar[int]
    calculate_entropy: bool
    with_reference: bool
    before_update: bool
    def __init__(self, calculate_entropy: _Optional[bool] = ..., with_reference: _Optional[bool] = ..., before_update: _Optional[bool] = ...) -> None: ...

class GenerateSequencesResponse(_message.Message):
    __slots__ = ("batch", "kept_rows")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    KEPT_ROWS_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    kept_rows: str
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ..., kept_rows: _Optional[str] = ...) -> None: ...

class SyncWeightsRequest(_message.Message):
    __slots__ = ("weights_version", "source", "transport", "force")
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    weights_version: int
    source: str
    transport: _weights_pb2.WeightTransport
    force: bool
    def __init__(self, weights_version: _Optional[int] = ..., source: _Optional[str] = ..., transport: _Optional[_Union[_weights_pb2.WeightTransport, str]] = ..., force: _Optional[bool] = ...) -> None: ...

class SyncWeightsResponse(_message.Message):
    __slots__ = ("weights_version", "transport", "bytes", "seconds", "transfer_seconds", "breakdown", "buffer_opened")
    class BreakdownEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BREAKDOWN_FIELD_NUMBER: _ClassVar[int]
    BUFFER_OPENED_FIELD_NUMBER: _ClassVar[int]
    weights_version: int
    transport: _weights_pb2.WeightTransport
    bytes: int
    seconds: float
    transfer_seconds: float
    breakdown: _containers.ScalarMap[str, float]
    buffer_opened: bool
    def __init__(self, weights_version: _Optional[int] = ..., transport: _Optional[_Union[_weights_pb2.WeightTransport, str]] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., transfer_seconds: _Optional[float] = ..., breakdown: _Optional[_Mapping[str, float]] = ..., buffer_opened: _Optional[bool] = ...) -> None: ...

class GetWeightsDigestRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetWeightsDigestResponse(_message.Message):
    __slots__ = ("weights_version", "sha256")
    class Sha256Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    weights_version: int
    sha256: _containers.ScalarMap[str, str]
    def __init__(self, weights_version: _Optional[int] = ..., sha256: _Optional[_Mapping[str, str]] = ...) -> None: ...
