from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConfigureRequest(_message.Message):
    __slots__ = ("run_id", "config_yaml", "protocol")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    config_yaml: str
    protocol: int
    def __init__(self, run_id: _Optional[str] = ..., config_yaml: _Optional[str] = ..., protocol: _Optional[int] = ...) -> None: ...

class ConfigureResponse(_message.Message):
    __slots__ = ("run_id", "pids", "ranks_restarted")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    RANKS_RESTARTED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    pids: _containers.RepeatedScalarFieldContainer[int]
    ranks_restarted: bool
    def __init__(self, run_id: _Optional[str] = ..., pids: _Optional[_Iterable[int]] = ..., ranks_restarted: _Optional[bool] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released_run_id",)
    RELEASED_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    released_run_id: str
    def __init__(self, released_run_id: _Optional[str] = ...) -> None: ...

class InterruptRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class InterruptResponse(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("role", "run_id", "world_size", "pids", "tensor_parallel", "pipeline_parallel", "expert_parallel", "tensor_bytes", "interrupted", "protocol", "startup")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    EXPERT_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    TENSOR_BYTES_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    STARTUP_FIELD_NUMBER: _ClassVar[int]
    role: str
    run_id: str
    world_size: int
    pids: _containers.RepeatedScalarFieldContainer[int]
    tensor_parallel: int
    pipeline_parallel: int
    expert_parallel: int
    tensor_bytes: int
    interrupted: bool
    protocol: int
    startup: _containers.RepeatedCompositeFieldContainer[StartupPhase]
    def __init__(self, role: _Optional[str] = ..., run_id: _Optional[str] = ..., world_size: _Optional[int] = ..., pids: _Optional[_Iterable[int]] = ..., tensor_parallel: _Optional[int] = ..., pipeline_parallel: _Optional[int] = ..., expert_parallel: _Optional[int] = ..., tensor_bytes: _Optional[int] = ..., interrupted: _Optional[bool] = ..., protocol: _Optional[int] = ..., startup: _Optional[_Iterable[_Union[StartupPhase, _Mapping]]] = ...) -> None: ...

class StartupPhase(_message.Message):
    __slots__ = ("name", "seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    seconds: float
    def __init__(self, name: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...
