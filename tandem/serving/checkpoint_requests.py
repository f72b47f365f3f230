"""SaveCheckpoint / LoadCheckpoint paths, checked on the front door before any rank starts.

A path that fails on one rank only (rank 0 creates the directory, then every rank writes)
would leave the other ranks waiting in a barrier, so everything that can be known before
the save is checked here: the path is absolute, writable, and is not a directory of
something else that a save would replace. Shared by the actor and critic servicers.
"""
from __future__ import annotations

import os

from tandem import checkpoint
from tandem.rpc.errors import FailedPrecondition, InvalidArgument, NotFound

LOAD_ERRORS = (KeyError, RuntimeError, ValueError, OSError)  # a load that does not fit -> FAILED_PRECONDITION


def save_path(path: str) -> str:
    """The directory a SaveCheckpoint may write (normalised); InvalidArgument / FailedPrecondition naming it."""
    if not path:
        raise InvalidArgument("path: must not be empty")
    if "\x00" in path:
        raise InvalidArgument("path: contains a NUL character")
    if not os.path.isabs(path):
        raise InvalidArgument(f"path: {path!r} must be absolute (it is a path on the service's machine)")
    path = os.path.normpath(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise InvalidArgument(f"path: {path!r} exists and is not a directory")
    if os.path.isdir(path) and os.listdir(path) and not checkpoint.is_checkpoint(path):
        raise FailedPrecondition(f"path: {path!r} is a directory that is not a Tandem checkpoint; a save "
                                 "replaces its directory, so it refuses to")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        for suffix in (".tmp", ".old"):  # what a save creates beside it
            probe = path + suffix
            if not os.path.lexists(probe):
                os.mkdir(probe)
                os.rmdir(probe)
    except OSError as e:
        raise FailedPrecondition(f"path: cannot write {path!r}: {e.strerror or e}") from None
    return path


def load_path(path: str) -> str:
    """A complete checkpoint directory; NotFound naming the path otherwise."""
    if "\x00" in path or not checkpoint.is_checkpoint(path):
        raise NotFound(f"path: {path!r} is not a complete checkpoint directory")
    return path
