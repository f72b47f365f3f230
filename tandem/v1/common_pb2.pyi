from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class LoadCheckpointRequest(_message.Message):
    __slots__ = ("path", "trunk_only")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TRUNK_ONLY_FIELD_NUMBER: _ClassVar[int]
    path: str
    trunk_only: bool
    def __init__(self, path: _Optional[str] = ..., trunk_only: _Optional[bool] = ...) -> None: ...

class LoadCheckpointResponse(_message.Message):
    __slots__ = ("weights_version",)
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    weights_version: int
    def __init__(self, weights_version: _Optional[int] = ...) -> None: ...
