from tandem.v1 import common_pb2 as _common_pb2
from tandem.v1 import data_pb2 as _data_pb2
from tandem.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Rows(_message.Message):
    __slots__ = ("batch", "kept")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    kept: KeptRows
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ..., kept: _Optional[_Union[KeptRows, _Mapping]] = ...) -> None: ...

class KeptRows(_message.Message):
    __slots__ = ("key", "rows")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    key: str
    rows: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, key: _Optional[str] = ..., rows: _Optional[_Iterable[int]] = ...) -> None: ...

class ComputeLogProbRequest(_message.Message):
    __slots__ = ("rows", "calculate_entropy", "with_reference", "before_update")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    CALCULATE_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    WITH_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    BEFORE_UPDATE_FIELD_NUMBER: _ClassVar[int]
    rows: Rows
    calculate_entropy: bool
    with_reference: bool
    before_update: bool
    def __init__(self, rows: _Optional[_Union[Rows, _Mapping]] = ..., calculate_entropy: _Optional[bool] = ..., with_reference: _Optional[bool] = ..., before_update: _Optional[bool] = ...) -> None: ...

class ComputeLogProbResponse(_message.Message):
    __slots__ = ("batch", "update_rows")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ROWS_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    update_rows: int
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ..., update_rows: _Optional[int] = ...) -> None: ...

class UpdateActorRequest(_message.Message):
    __slots__ = ("rows", "batch")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    rows: Rows
    batch: _data_pb2.Batch
    def __init__(self, rows: _Optional[_Union[Rows, _Mapping]] = ..., batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ...) -> None: ...

class UpdateActorResponse(_message.Message):
    __slots__ = ("metrics", "weights_version", "batch", "update_rows")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    METRICS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ROWS_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.ScalarMap[str, float]
    weights_version: int
    batch: _data_pb2.Batch
    update_rows: int
    def __init__(self, metrics: _Optional[_Mapping[str, float]] = ..., weights_version: _Optional[int] = ..., batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ..., update_rows: _Optional[int] = ...) -> None: ...

class TrainSftRequest(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ...) -> None: ...

class TrainSftResponse(_message.Message):
    __slots__ = ("metrics", "weights_version")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    METRICS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.ScalarMap[str, float]
    weights_version: int
    def __init__(self, metrics: _Optional[_Mapping[str, float]] = ..., weights_version: _Optional[int] = ...) -> None: ...

class SetReferenceRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetReferenceResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
