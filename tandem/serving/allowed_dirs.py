"""The directories a service imports Python files from (`--allow-dir`, repeatable), and the check
that a run's config names none outside them.

A configuration can name code the service then imports (verl's custom reward function). A service
takes such files only from the directories it was started with, so a Configure sent over the wire
cannot make it import an arbitrary path: one outside is refused INVALID_ARGUMENT before anything is
imported. The local launcher allows the directories of the run's own config's files, so `tandem
run` works as before; the controller service's pool allows `tandem serve --allow-dir`.

Deliberately not here: importing the file (tandem/reward/function_file.py).
"""
from __future__ import annotations

import functools
import os
from collections.abc import Sequence

from tandem.rpc.errors import InvalidArgument

CODE_KEYS = ("custom_reward_function.path",)  # config keys naming a Python file a service imports


def code_files(cfg) -> dict[str, str]:
    """{config key: path} of the Python files `cfg` names for a service to import."""
    found = {key: functools.reduce(getattr, key.split("."), cfg) for key in CODE_KEYS}
    return {key: path for key, path in found.items() if path}


def code_dirs(cfg) -> list[str]:
    """The directories of those files: what a launcher allows for its own run."""
    return sorted({os.path.dirname(os.path.realpath(path)) for path in code_files(cfg).values()})


def is_inside(path: str, dirs: Sequence[str]) -> bool:
    """`path`, symbolic links resolved, lies under one of `dirs` (resolved too)."""
    real = os.path.realpath(path)
    return any(os.path.commonpath([real, os.path.realpath(d)]) == os.path.realpath(d) for d in dirs)


def check_allowed(cfg, dirs: Sequence[str]) -> None:
    """InvalidArgument naming the key, the file and the allowed directories for each file of `cfg`
    outside `dirs` (nothing is imported)."""
    outside = [f"{key}: {path!r} is outside the directories this service imports code from "
               f"({', '.join(dirs) if dirs else 'none'}; start it with --allow-dir DIR); not imported"
               for key, path in code_files(cfg).items() if not is_inside(path, dirs)]
    if outside:
        raise InvalidArgument("; ".join(outside))
