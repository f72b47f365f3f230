"""Tandem exception types and their gRPC status codes, both directions.

Servicers and workers raise a TandemError subclass; `tandem.rpc.server`
turns it into a status (code + message). Clients turn a failed call back into
the same subclass with `error_from_rpc`. Imports only grpc.
"""

from __future__ import annotations

import grpc


class TandemError(Exception):
    """Base class: an error with a gRPC status code and a human message."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN


class InvalidArgument(TandemError):
    """Bad request: shapes, dtypes, missing columns, token ids out of range."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class FailedPrecondition(TandemError):
    """The service is not in a state to do this (e.g. not initialised)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(TandemError):
    """Overload or out of memory; retry later or with less."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class NotFound(TandemError):
    """A named thing (checkpoint path, weights version) does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(TandemError):
    """A thing to be created under a name exists already (an environment episode's instance id)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class Unavailable(TandemError):
    """The service cannot be reached or is shutting down."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(TandemError):
    """The call ran past its deadline."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Aborted(TandemError):
    """The work was stopped on purpose: its run is being cancelled, or a conflict with concurrent
    work (e.g. weights changed while being read; retry)."""

    code = grpc.StatusCode.ABORTED


class Internal(TandemError):
    """A bug or unexpected failure inside the service."""

    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[TandemError]] = {
    cls.code: cls
    for cls in (InvalidArgument, FailedPrecondition, ResourceExhausted, NotFound, AlreadyExists,
                Unavailable, DeadlineExceeded, Aborted, Internal)
}


def error_for_code(code: grpc.StatusCode | None, message: str) -> TandemError:
    """The TandemError subclass for `code` (base TandemError with that code if none)."""
    cls = _BY_CODE.get(code)  # type: ignore[arg-type]
    if cls is not None:
        return cls(message)
    err = TandemError(message)
    err.code = code or grpc.StatusCode.UNKNOWN
    return err


def error_from_rpc(e: grpc.RpcError, method: str | None = None) -> TandemError:
    """Map a failed call to its TandemError; message "<method>: <details>"."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else None
    msg = details or (code.name if code else str(e))
    if method:
        msg = f"{method}: {msg}"
    return error_for_code(code, msg)
