from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitRunRequest(_message.Message):
    __slots__ = ("config_yaml", "overrides", "source")
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    overrides: _containers.RepeatedScalarFieldContainer[str]
    source: str
    def __init__(self, config_yaml: _Optional[str] = ..., overrides: _Optional[_Iterable[str]] = ..., source: _Optional[str] = ...) -> None: ...

class SubmitRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: RunRecord
    def __init__(self, run: _Optional[_Union[RunRecord, _Mapping]] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run", "latest_metrics")
    class LatestMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RUN_FIELD_NUMBER: _ClassVar[int]
    LATEST_METRICS_FIELD_NUMBER: _ClassVar[int]
    run: RunRecord
    latest_metrics: _containers.ScalarMap[str, float]
    def __init__(self, run: _Optional[_Union[RunRecord, _Mapping]] = ..., latest_metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunRecord]
    def __init__(self, runs: _Optional[_Iterable[_Union[RunRecord, _Mapping]]] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: RunRecord
    def __init__(self, run: _Optional[_Union[RunRecord, _Mapping]] = ...) -> None: ...

class StreamEventsRequest(_message.Message):
    __slots__ = ("run_id", "from_step", "after_seq", "follow")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    from_step: int
    after_seq: int
    follow: bool
    def __init__(self, run_id: _Optional[str] = ..., from_step: _Optional[int] = ..., after_seq: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("seq", "step", "time", "log", "metrics", "state")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    seq: int
    step: int
    time: float
    log: str
    metrics: MetricsEvent
    state: str
    def __init__(self, seq: _Optional[int] = ..., step: _Optional[int] = ..., time: _Optional[float] = ..., log: _Optional[str] = ..., metrics: _Optional[_Union[MetricsEvent, _Mapping]] = ..., state: _Optional[str] = ...) -> None: ...

class MetricsEvent(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, float]
    def __init__(self, values: _Optional[_Mapping[str, float]] = ...) -> None: ...

class RunRecord(_message.Message):
    __slots__ = ("id", "state", "source", "overrides", "config_yaml", "created", "started", "finished", "run_dir", "last_step", "total_steps", "summary_json", "error", "cancel_requested", "resumed_from", "experiment", "service_pids_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    RUN_DIR_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_FIELD_NUMBER: _ClassVar[int]
    SERVICE_PIDS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    source: str
    overrides: _containers.RepeatedScalarFieldContainer[str]
    config_yaml: str
    created: float
    started: float
    finished: float
    run_dir: str
    last_step: int
    total_steps: int
    summary_json: str
    error: str
    cancel_requested: bool
    resumed_from: str
    experiment: str
    service_pids_json: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., source: _Optional[str] = ..., overrides: _Optional[_Iterable[str]] = ..., config_yaml: _Optional[str] = ..., created: _Optional[float] = ..., started: _Optional[float] = ..., finished: _Optional[float] = ..., run_dir: _Optional[str] = ..., last_step: _Optional[int] = ..., total_steps: _Optional[int] = ..., summary_json: _Optional[str] = ..., error: _Optional[str] = ..., cancel_requested: _Optional[bool] = ..., resumed_from: _Optional[str] = ..., experiment: _Optional[str] = ..., service_pids_json: _Optional[str] = ...) -> None: ...
