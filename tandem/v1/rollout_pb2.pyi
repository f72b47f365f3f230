from tandem.v1 import data_pb2 as _data_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_new_tokens", "n", "seed", "stop_token_ids", "greedy")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    GREEDY_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    n: int
    seed: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    greedy: bool
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., n: _Optional[int] = ..., seed: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., greedy: _Optional[bool] = ...) -> None: ...

class GenerateSequencesRequest(_message.Message):
    __slots__ = ("batch", "sampling")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    sampling: SamplingParams
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ...) -> None: ...

class GenerateSequencesResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: _data_pb2.Batch
    def __init__(self, batch: _Optional[_Union[_data_pb2.Batch, _Mapping]] = ...) -> None: ...

class LoadWeightsRequest(_message.Message):
    __slots__ = ("weights", "weights_version")
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    weights: _data_pb2.NamedTensors
    weights_version: int
    def __init__(self, weights: _Optional[_Union[_data_pb2.NamedTensors, _Mapping]] = ..., weights_version: _Optional[int] = ...) -> None: ...

class LoadWeightsResponse(_message.Message):
    __slots__ = ("weights_version",)
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    weights_version: int
    def __init__(self, weights_version: _Optional[int] = ...) -> None: ...
