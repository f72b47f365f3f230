from tandem.v1 import data_pb2 as _data_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreRequest(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "extra", "failures")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    extra: _data_pb2.Batch
    failures: _containers.RepeatedCompositeFieldContainer[RowFailure]
    def __init__(self, scores: _Optional[_Iterable[float]] = ..., extra: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ..., failures: _Optional[_Iterable[_Union[RowFailure, _Mapping]]] = ...) -> None: ...

class RowFailure(_message.Message):
    __slots__ = ("row", "reason")
    ROW_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    row: int
    reason: str
    def __init__(self, row: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...
