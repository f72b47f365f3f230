from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListToolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListToolsResponse(_message.Message):
    __slots__ = ("tools",)
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    tools: _containers.RepeatedCompositeFieldContainer[ToolSchema]
    def __init__(self, tools: _Optional[_Iterable[_Union[ToolSchema, _Mapping]]] = ...) -> None: ...

class ToolSchema(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class CallToolRequest(_message.Message):
    __slots__ = ("name", "arguments_json", "call_id", "instance_kwargs_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments_json: str
    call_id: str
    instance_kwargs_json: str
    def __init__(self, name: _Optional[str] = ..., arguments_json: _Optional[str] = ..., call_id: _Optional[str] = ..., instance_kwargs_json: _Optional[str] = ...) -> None: ...

class CallToolResponse(_message.Message):
    __slots__ = ("text", "is_error")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    text: str
    is_error: bool
    def __init__(self, text: _Optional[str] = ..., is_error: _Optional[bool] = ...) -> None: ...

class StartEpisodeRequest(_message.Message):
    __slots__ = ("instance_id", "task_json")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_JSON_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    task_json: str
    def __init__(self, instance_id: _Optional[str] = ..., task_json: _Optional[str] = ...) -> None: ...

class StartEpisodeResponse(_message.Message):
    __slots__ = ("observation",)
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    observation: str
    def __init__(self, observation: _Optional[str] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("instance_id", "action")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    action: str
    def __init__(self, instance_id: _Optional[str] = ..., action: _Optional[str] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("observation", "reward", "done")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    observation: str
    reward: float
    done: bool
    def __init__(self, observation: _Optional[str] = ..., reward: _Optional[float] = ..., done: _Optional[bool] = ...) -> None: ...

class CloseEpisodeRequest(_message.Message):
    __slots__ = ("instance_id",)
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    def __init__(self, instance_id: _Optional[str] = ...) -> None: ...

class CloseEpisodeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
