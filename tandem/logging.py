"""structlog setup: one JSON object per line on stderr, for every role.

Each line carries timestamp, level, event, role, rank and run_id, plus the
contextvars bound per RPC by `tandem.rpc.interceptors` (method, step,
request_id, and run_id when the caller sends one). Call
`configure_logging` once at process start; `get_logger` anywhere.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(role: str, rank: int = 0, run_id: str | None = None, level: str = "INFO") -> None:
    """Route structlog (and stdlib logging at WARNING+) to JSON lines on stderr."""
    static = {"role": role, "rank": rank, "run_id": run_id}

    def add_static(_logger, _name, event_dict):
        for k, v in static.items():
            event_dict.setdefault(k, v)  # a per-RPC x-run-id wins over the default
        return event_dict

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_static,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(default=str),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Libraries (grpc, torch) log through stdlib logging; keep their warnings, as JSON too.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.processors.add_log_level,
                           structlog.processors.TimeStamper(fmt="iso", utc=True), add_static],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.JSONRenderer(default=str)]))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.WARNING)


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    """A structlog logger that adds `logger_name=name` to every line.

    Lazy: safe to call at import time, before `configure_logging`.
    """
    return structlog.get_logger(logger_name=name)
