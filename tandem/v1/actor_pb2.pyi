from tandem.v1 import common_pb2 as _common_pb2
from tandem.v1 import data_pb2 as _data_pb2
from tandem.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ComputeLogProbRequest(_message.Message):
    __slots__ = ("batch", "calculate_entropy", "with_reference", "policy_from_row", "kept_rows")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CALCULATE_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    WITH_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FROM_ROW_FIELD_NUMBER: _ClassVar[int]
    KEPT_ROWS_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    calculate_entropy: bool
    with_reference: bool
    policy_from_row: int
    kept_rows: str
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ..., calculate_entropy: _Optional[bool] = ..., with_reference: _Optional[bool] = ..., policy_from_row: _Optional[int] = ..., kept_rows: _Optional[str] = ...) -> None: ...

class ComputeLogProbResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ...) -> None: ...

class ComputeRefLogProbRequest(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ...) -> None: ...

class ComputeRefLogProbResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ...) -> None: ...

class UpdateActorRequest(_message.Message):
    __slots__ = ("batch", "on_policy", "on_policy_rows", "kept_rows")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ON_POLICY_FIELD_NUMBER: _ClassVar[int]
    ON_POLICY_ROWS_FIELD_NUMBER: _ClassVar[int]
    KEPT_ROWS_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    on_policy: bool
    on_policy_rows: int
    kept_rows: str
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ..., on_policy: _Optional[bool] = ..., on_policy_rows: _Optional[int] = ..., kept_rows: _Optional[str] = ...) -> None: ...

class UpdateActorResponse(_message.Message):
    __slots__ = ("metrics", "weights_version", "batch")
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
    metrics: _containers.ScalarMap[str, float]
    weights_version: int
    batch: _data_pb2.Batch
    def __init__(self, metrics: _Optional[_Mapping[str, float]] = ..., weights_version: _Optional[int] = ..., batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ...) -> None: ...

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
